package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/lab/controlplane"
)

// A short `amf-lab bench signal` in both modes, one table: real brokers in
// real cgroups, a real sidecar and agent on loopback, a real API server and
// amf-agent --node-mode. It checks what must hold whatever the machine's
// speed: every (mode, case) has a sample per run, every kill reaches the
// agent by the push meant to carry it (the OOM notification for the OOM
// kill, the exit for node mode's SIGKILL), and the last line is the JSON
// report with both modes' fields beside the ones it always had.
func TestSignalBenchMeasuresBothModesSideBySide(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane, brokers, a sidecar and agents")
	}
	if os.Geteuid() != 0 {
		if os.Getenv(controlplane.EnvRequire) == "1" {
			t.Fatalf("%s=1 but not root: the benchmark creates cgroups", controlplane.EnvRequire)
		}
		t.Skip("skip: the benchmark creates cgroups: needs root")
	}
	if _, err := controlplane.BinDir(); err != nil {
		if os.Getenv(controlplane.EnvRequire) == "1" {
			t.Fatalf("control plane not built (%v) and %s=1: run make k8s", err, controlplane.EnvRequire)
		}
		t.Skipf("skip: control plane not built (%v): run make k8s", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const runs = 2
	var progress bytes.Buffer
	rep, err := RunSignal(ctx, SignalConfig{Runs: runs, KeepAlive: time.Second,
		Poller: PollerConfig{Period: 300 * time.Millisecond, Timeout: 200 * time.Millisecond, Threshold: 3},
		Bin:    buildBinaries(t), WorkDir: t.TempDir(), Progress: &progress})
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatal(err)
	}
	if rep.OOMSkipped != "" || rep.Node == nil {
		t.Fatalf("sidecar OOM skipped (%q), node mode ran: %v; want both modes' every case", rep.OOMSkipped, rep.Node != nil)
	}
	for _, tc := range []struct {
		mode   string
		c      Case
		reason string // each sample's reason holds it; "" for cases without one
	}{
		{ModeSidecar, rep.BrokerCrash, ""}, // the probe's lost connection
		{ModeSidecar, rep.OOM, "OOM kill"},
		{ModeSidecar, rep.Poller, ""},
		{ModeSidecar, rep.SidecarCrash, ""},
		{ModeSidecar, rep.SidecarFreeze, ""},
		{ModeNode, rep.Node.BrokerCrash, "its process exited"},
		{ModeNode, rep.Node.OOM, "OOM kill"},
	} {
		if len(tc.c.Samples) != runs {
			t.Errorf("%s mode, %s: %d samples, want %d", tc.mode, tc.c.Name, len(tc.c.Samples), runs)
		}
		for i, r := range tc.c.Reasons {
			if !strings.Contains(r, tc.reason) {
				t.Errorf("%s mode, %s, run %d: reason %q, want %q", tc.mode, tc.c.Name, i+1, r, tc.reason)
			}
		}
		// Pushed, not sampled (1 s): bounded generously, the numbers are
		// the benchmark's.
		if tc.c.Name != rep.Poller.Name && tc.c.Name != rep.SidecarFreeze.Name {
			if s := Summarise(tc.c.Samples); s.Max > 900*time.Millisecond {
				t.Errorf("%s mode, %s: slowest %v: not pushed", tc.mode, tc.c.Name, s.Max)
			}
		}
	}
	if n := len(rep.Rows()); n != 7 {
		t.Errorf("%d table rows, want 7 (5 sidecar, 2 node)", n)
	}

	var out bytes.Buffer
	if err := PrintSignal(&out, rep); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var last map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
		t.Fatalf("last line %q: %v", lines[len(lines)-1], err)
	}
	for _, k := range []string{"scm_p99_ms", "pcm_p99_ms", "ratio", "sidecar_oom_p99_ms", "node_crash_p99_ms", "node_oom_p99_ms"} {
		if _, ok := last[k]; !ok {
			t.Errorf("last line lacks %q: %s", k, lines[len(lines)-1])
		}
	}
	if !strings.Contains(out.String(), "node     OOM kill") {
		t.Errorf("no node-mode OOM row in the table:\n%s", out.String())
	}
}
