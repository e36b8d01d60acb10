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

// One short round of the node-mode benchmark: a real agent binary in node
// mode, a real API server, real cgroups with a real process each. It checks
// what must hold whatever the machine's speed: every pod reaches the
// tracker, every kill is pushed, and the last line is the JSON report; the
// numbers are the benchmark's (`amf-lab bench agent --mode node`).
func TestNodeModeBenchWatchesEveryPodAndTimesEachKill(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane and an agent")
	}
	if os.Geteuid() != 0 {
		t.Skip("skip: the benchmark creates cgroups: needs root")
	}
	if _, err := controlplane.BinDir(); err != nil {
		if os.Getenv(controlplane.EnvRequire) == "1" {
			t.Fatalf("control plane not built (%v) and %s=1: run make k8s", err, controlplane.EnvRequire)
		}
		t.Skipf("skip: control plane not built (%v): run make k8s", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	rep, err := RunNodeMode(ctx, NodeModeConfig{Pods: 5, Duration: 2 * time.Second, Kills: 3, OOMKills: 2, Bin: buildBinaries(t), WorkDir: t.TempDir(), Progress: &progress})
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Pods != 5 || rep.Kills != 3 || rep.StartSeconds <= 0 || rep.RSSMiB <= 0 {
		t.Errorf("report %+v: want 5 pods watched and 3 kills timed", rep)
	}
	if rep.ExitMaxMillis > 5000 {
		t.Errorf("slowest kill reached the tracker after %.0f ms: the exit is pushed, not sampled", rep.ExitMaxMillis)
	}
	if n := strings.Count(progress.String(), "its process exited"); n != 3 {
		t.Errorf("%d kills seen through the pushed exit, want 3", n)
	}
	if n := strings.Count(progress.String(), "(OOM kill in the broker container"); rep.OOMKills != 2 || n != 2 {
		t.Errorf("%d OOM kills timed, %d seen through the OOM notification; want 2", rep.OOMKills, n)
	}
	var out bytes.Buffer
	if err := PrintNodeMode(&out, rep); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var last map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
		t.Fatalf("last line %q: %v", lines[len(lines)-1], err)
	}
	for _, k := range []string{"pods", "rss_mib_per_pod", "cpu_pct_per_pod", "exit_p99_ms", "oom_p99_ms"} {
		if _, ok := last[k]; !ok {
			t.Errorf("last line lacks %q: %s", k, lines[len(lines)-1])
		}
	}
}
