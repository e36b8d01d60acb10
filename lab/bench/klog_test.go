package bench

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestParseProbeFailureReadsTheKubeletsLine(t *testing.T) {
	near := time.Date(2026, 12, 1, 15, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		line string
		ok   bool
		want probeFailure
	}{
		{
			name: "exec liveness timed out",
			line: `I1201 14:52:03.123456    4567 prober.go:122] "Probe failed" probeType="Liveness" pod="signal-1/broker-exec-7d9f" podUID="0c1d" containerName="mosquitto" probeResult="failure" output="command timed out: \"mosquitto_sub -t $SYS/#\" timed out after 1s"`,
			ok:   true,
			want: probeFailure{Time: time.Date(2026, 12, 1, 14, 52, 3, 123456000, time.UTC), Type: "Liveness", Pod: "signal-1/broker-exec-7d9f",
				Container: "mosquitto", Output: `command timed out: "mosquitto_sub -t $SYS/#" timed out after 1s`},
		},
		{
			name: "an error counts as a failure",
			line: `I1201 14:52:04.000001    4567 prober.go:108] "Probe errored" probeType="Readiness" pod="a/b" podUID="u" containerName="c" probeResult="failure" err="rpc error"`,
			ok:   true,
			want: probeFailure{Time: time.Date(2026, 12, 1, 14, 52, 4, 1000, time.UTC), Type: "Readiness", Pod: "a/b", Container: "c", Output: "rpc error"},
		},
		{
			name: "a line of last year, read on New Year's day",
			line: `I1231 23:59:59.500000    4567 prober.go:122] "Probe failed" probeType="Liveness" pod="a/b" containerName="c" output=""`,
			ok:   true,
			want: probeFailure{Time: time.Date(2025, 12, 31, 23, 59, 59, 500000000, time.UTC), Type: "Liveness", Pod: "a/b", Container: "c"},
		},
		{name: "another message", line: `I1201 14:52:03.123456    4567 kubelet.go:2400] "SyncLoop (PLEG): event for pod" pod="a/b"`},
		{name: "not klog", line: `=== 2026-12-01T14:50:00Z /bin/sh -c kubelet`},
		{name: "cut short", line: `I1201 14:52`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at := near
			if tc.name == "a line of last year, read on New Year's day" {
				at = time.Date(2026, 1, 1, 0, 0, 5, 0, time.UTC)
			}
			got, ok := parseProbeFailure(tc.line, at, time.UTC)
			if ok != tc.ok {
				t.Fatalf("ok %v, want %v (%+v)", ok, tc.ok, got)
			}
			if ok && (!got.Time.Equal(tc.want.Time) || got.Type != tc.want.Type || got.Pod != tc.want.Pod || got.Container != tc.want.Container || got.Output != tc.want.Output) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestProbeFailuresKeepsOnePodsLivenessInTheWindow(t *testing.T) {
	log := `=== 2026-12-01T14:50:00Z kubelet
I1201 14:51:59.999999 1 prober.go:122] "Probe failed" probeType="Liveness" pod="ns/p" containerName="mosquitto" output="before"
I1201 14:52:00.000000 1 prober.go:122] "Probe failed" probeType="Liveness" pod="ns/p" containerName="mosquitto" output="first"
I1201 14:52:05.000000 1 prober.go:122] "Probe failed" probeType="Readiness" pod="ns/p" containerName="mosquitto" output="readiness"
I1201 14:52:06.000000 1 prober.go:122] "Probe failed" probeType="Liveness" pod="ns/other" containerName="mosquitto" output="other pod"
I1201 14:52:07.000000 1 prober.go:122] "Probe failed" probeType="Liveness" pod="ns/p" containerName="amf-sidecar" output="other container"
I1201 14:52:09.000000 1 prober.go:122] "Probe failed" probeType="Liveness" pod="ns/p" containerName="mosquitto" output="second"
I1201 14:52:10.000000 1 prober.go:122] "Probe failed" probeType="Liveness" pod="ns/p" containerName="mosquitto" output="at the end"
`
	path := filepath.Join(t.TempDir(), "kubelet.log")
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	from := time.Date(2026, 12, 1, 14, 52, 0, 0, time.Local)
	got, err := probeFailures(path, from, from.Add(10*time.Second), "ns/p", "mosquitto")
	if err != nil {
		t.Fatal(err)
	}
	var outs []string
	for _, f := range got {
		outs = append(outs, f.Output)
	}
	if len(outs) != 2 || outs[0] != "first" || outs[1] != "second" {
		t.Errorf("failures %q, want [first second]", outs)
	}
}
