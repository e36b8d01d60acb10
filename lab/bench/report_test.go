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

func TestPrintNodeEndsWithTheJSONLineOfEveryCase(t *testing.T) {
	d := func(ms ...float64) []time.Duration {
		var out []time.Duration
		for _, m := range ms {
			out = append(out, time.Duration(m*float64(time.Millisecond)))
		}
		return out
	}
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
