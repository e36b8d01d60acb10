package bench

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestSummariseUsesNearestRank(t *testing.T) {
	var s []time.Duration
	for i := 100; i >= 1; i-- {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	got := Summarise(s)
	want := Summary{N: 100, Min: time.Millisecond, Median: 50 * time.Millisecond, P99: 99 * time.Millisecond, Max: 100 * time.Millisecond}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if few := Summarise([]time.Duration{3, 1, 2}); few.P99 != 3 || few.Median != 2 {
		t.Fatalf("three samples: %+v", few)
	}
	if (Summarise(nil) != Summary{}) {
		t.Fatal("empty set must give a zero summary")
	}
}

func TestPrintSignalEndsWithTheJSONLine(t *testing.T) {
	r := &SignalReport{
		BrokerCrash: Case{Name: "scm", Samples: []time.Duration{2 * time.Millisecond, 4 * time.Millisecond}},
		Poller:      Case{Name: "pcm", Samples: []time.Duration{20 * time.Second, 28 * time.Second}},
	}
	var out bytes.Buffer
	if err := PrintSignal(&out, r); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var last struct {
		SCM, PCM, Ratio float64
	}
	if err := json.Unmarshal([]byte(strings.NewReplacer("scm_p99_ms", "SCM", "pcm_p99_ms", "PCM", "ratio", "Ratio").Replace(lines[len(lines)-1])), &last); err != nil {
		t.Fatalf("last line %q: %v", lines[len(lines)-1], err)
	}
	if last.SCM != 4 || last.PCM != 28000 || last.Ratio != 7000 {
		t.Fatalf("JSON line %+v", last)
	}
}

func TestPrintSignalHasARowPerModeAndCaseAndPerModeJSON(t *testing.T) {
	d := msDurations
	both := &SignalReport{Modes: []string{ModeSidecar, ModeNode}, Runs: 2,
		BrokerCrash: Case{Name: "crash", Samples: d(2, 4)}, Poller: Case{Name: "poller", Samples: d(20000, 28000)},
		SidecarCrash: Case{Name: "sidecar crash", Samples: d(1, 3)}, SidecarFreeze: Case{Name: "freeze", Samples: d(7000, 7000)},
		OOM:  Case{Name: "oom", Samples: d(3, 5)},
		Node: &NodeSignalReport{BrokerCrash: Case{Name: "crash", Samples: d(1, 2)}, OOM: Case{Name: "oom", Samples: d(6, 8)}}}
	noCgroup := &SignalReport{Modes: []string{ModeSidecar}, Runs: 2,
		BrokerCrash: Case{Name: "crash", Samples: d(2, 4)}, Poller: Case{Name: "poller", Samples: d(20000, 28000)},
		OOMSkipped: "not root"}
	f := func(v float64) *float64 { return &v }
	// Medians by nearest rank: of two samples, the lower.
	for _, tc := range []struct {
		name string
		r    *SignalReport
		rows []string // mode + case name
		want SignalLine
	}{
		{"both modes", both,
			[]string{"sidecar crash", "sidecar oom", "sidecar poller", "sidecar sidecar crash", "sidecar freeze", "node crash", "node oom"},
			SignalLine{SCM: 4, PCM: 28000, Ratio: 7000, Modes: []string{"sidecar", "node"}, Runs: 2,
				SidecarCrashP50: f(2), SidecarCrashP99: f(4), SidecarOOMP50: f(3), SidecarOOMP99: f(5),
				NodeCrashP50: f(1), NodeCrashP99: f(2), NodeOOMP50: f(6), NodeOOMP99: f(8)}},
		{"sidecar without a cgroup: no OOM row or field", noCgroup,
			[]string{"sidecar crash", "sidecar poller", "sidecar ", "sidecar "},
			SignalLine{SCM: 4, PCM: 28000, Ratio: 7000, Modes: []string{"sidecar"}, Runs: 2, SidecarCrashP50: f(2), SidecarCrashP99: f(4)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rows []string
			for _, r := range tc.r.Rows() {
				rows = append(rows, r.Mode+" "+r.Case.Name)
			}
			if strings.Join(rows, "|") != strings.Join(tc.rows, "|") {
				t.Errorf("rows %q, want %q", rows, tc.rows)
			}
			var out bytes.Buffer
			if err := PrintSignal(&out, tc.r); err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			var got SignalLine
			if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
				t.Fatalf("last line %q: %v", lines[len(lines)-1], err)
			}
			if g, w := mustJSON(t, got), mustJSON(t, tc.want); g != w {
				t.Errorf("JSON line %s\nwant      %s", g, w)
			}
		})
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestPrintNodeEndsWithTheJSONLineOfEveryCase(t *testing.T) {
	d := msDurations
	r := &NodeReport{
		CrashSignal: Case{Samples: d(2, 5)}, CrashStatus: Case{Samples: d(400, 1000)},
		HangSignal: Case{Samples: d(1500, 2500)}, HangDecided: Case{Samples: d(25000)}, HangStatus: Case{Samples: d(55000)},
		HangTCPRuns: 1,
		LoadRuns:    []*LoadResult{{Kind: ProbeExec, Runs: 1, Restarts: 2, FalseSignals: 0}, {Kind: ProbeTCP, Runs: 1, FalseSignals: 1}},
	}
	var out bytes.Buffer
	if err := PrintNode(&out, r); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var got NodeLine
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("last line %q: %v", lines[len(lines)-1], err)
	}
	want := NodeLine{SCM: 5, PCM: 1000, Ratio: 200, HangSCM: 2500, HangPCM: 25000, HangRatio: 10, HangPCMStatus: 55000, FalseRestarts: 2, FalseSignals: 1}
	if got != want {
		t.Fatalf("JSON line %+v\nwant      %+v", got, want)
	}
}

// msDurations are durations of so many milliseconds each.
func msDurations(ms ...float64) []time.Duration {
	var out []time.Duration
	for _, m := range ms {
		out = append(out, time.Duration(m*float64(time.Millisecond)))
	}
	return out
}
