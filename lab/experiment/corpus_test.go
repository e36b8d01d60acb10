package experiment

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/csv"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/lab/corpus"
	"github.com/amf-edge/amf/lab/stress"
	"github.com/amf-edge/amf/lab/testbed"
)

// planned is the run id of the plan from seed, as a recorded CorpusRun.
func planned(t *testing.T, seed uint64, id string) CorpusRun {
	t.Helper()
	runs, err := corpus.Plan(seed, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range runs {
		if r.ID == id {
			return CorpusRun{ID: r.ID, Family: r.Family, Failing: r.Failing, Seed: r.Seed, Profile: r.Profile.String()}
		}
	}
	t.Fatalf("no run %s in the plan", id)
	return CorpusRun{}
}

// rowsOf are two samples of each run.
func rowsOf(runs []CorpusRun) [][]string {
	var rows [][]string
	for _, r := range runs {
		for _, at := range []string{"1.000", "2.000"} {
			rows = append(rows, []string{r.ID, r.Family, at, "0.5", "1048576", "104857600", "", "0", at, "", "0"})
		}
	}
	return rows
}

// writeCorpus writes a corpus folder as Corpus does, with the given header.
func writeCorpus(t *testing.T, dir string, header []string, runs []CorpusRun) {
	t.Helper()
	w, err := createRows(filepath.Join(dir, corpusCSV), false)
	if err != nil {
		t.Fatal(err)
	}
	w.write(append([][]string{header}, rowsOf(runs)...))
	if err := w.close(); err != nil {
		t.Fatal(err)
	}
	if err := writeRuns(filepath.Join(dir, corpusRuns), runs); err != nil {
		t.Fatal(err)
	}
}

func readRows(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f) // reads every gzip member, as gzip -d does
	if err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(zr).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

func TestAppendCorpus(t *testing.T) {
	old := []CorpusRun{planned(t, 1, "mem-ramp-1"), planned(t, 1, "idle-1")}
	badHeader := slices.Clone(CorpusHeader[:len(CorpusHeader)-1])
	for _, tc := range []struct {
		name   string
		header []string    // the existing corpus's; nil: no corpus there
		have   []CorpusRun // the existing corpus's runs
		add    []CorpusRun
		leadIn corpus.LeadIn // of the added runs
		// refused names what the error must say; empty: the append succeeds.
		refused string
	}{
		{name: "adds the new runs and their rows after the existing ones", header: CorpusHeader, have: old,
			add: []CorpusRun{planned(t, 1, "traffic-burst-1"), planned(t, 1, "traffic-burst-2")}},
		{name: "adds further runs of a family already there", header: CorpusHeader, have: old,
			add: []CorpusRun{planned(t, 1, "mem-ramp-2")}},
		{name: "refuses a run already in the corpus", header: CorpusHeader, have: old,
			add: []CorpusRun{planned(t, 1, "traffic-burst-1"), planned(t, 1, "idle-1")}, refused: "idle-1 is already in"},
		{name: "refuses a corpus with another header", header: badHeader, have: old,
			add: []CorpusRun{planned(t, 1, "traffic-burst-1")}, refused: "header"},
		{name: "refuses a corpus planned from another seed", header: CorpusHeader, have: []CorpusRun{planned(t, 2, "mem-ramp-1")},
			add: []CorpusRun{planned(t, 1, "traffic-burst-1")}, refused: "another --seed"},
		{name: "adds runs recorded with the corpus's lead-in (recorded before ranges: no spec)", header: CorpusHeader,
			have: withLeadIn(old, "10m0s"), leadIn: fixed10m,
			add: withDrawn(t, []CorpusRun{planned(t, 1, "traffic-burst-1")}, fixed10m)},
		{name: "refuses runs with another lead-in than the corpus's", header: CorpusHeader, have: old, leadIn: fixed10m,
			add: withDrawn(t, []CorpusRun{planned(t, 1, "traffic-burst-1")}, fixed10m), refused: "--lead-in 0s, not 10m0s"},
		{name: "adds runs drawn from the corpus's lead-in range", header: CorpusHeader,
			have: withDrawn(t, old, upTo10m), leadIn: upTo10m,
			add: withDrawn(t, []CorpusRun{planned(t, 1, "traffic-burst-1"), planned(t, 1, "mem-ramp-2")}, upTo10m)},
		{name: "refuses runs drawn from another range", header: CorpusHeader,
			have: withDrawn(t, old, upTo10m), leadIn: corpus.LeadIn{Max: 5 * time.Minute},
			add:     withDrawn(t, []CorpusRun{planned(t, 1, "traffic-burst-1")}, corpus.LeadIn{Max: 5 * time.Minute}),
			refused: "was recorded with --lead-in 0s-10m0s, not 0s-5m0s"},
		{name: "refuses a fixed lead-in beside a range with it as its end", header: CorpusHeader,
			have: withDrawn(t, old, upTo10m), leadIn: fixed10m,
			add:     withDrawn(t, []CorpusRun{planned(t, 1, "traffic-burst-1")}, fixed10m),
			refused: "was recorded with --lead-in 0s-10m0s, not 10m0s"},
		{name: "refuses a corpus whose runs drew other lead-ins than this build draws", header: CorpusHeader,
			have: func() []CorpusRun {
				h := withDrawn(t, old, upTo10m)
				h[1].LeadIn = "10m0s" // idle-1: a range's end, not its draw
				return h
			}(), leadIn: upTo10m,
			add:     withDrawn(t, []CorpusRun{planned(t, 1, "traffic-burst-1")}, upTo10m),
			refused: "has a lead-in of 10m0s where this build draws"},
		{name: "refuses a corpus whose runs.json has a lead-in it cannot read", header: CorpusHeader,
			have: withLeadIn(old, "ten minutes"), leadIn: fixed10m,
			add:     withDrawn(t, []CorpusRun{planned(t, 1, "traffic-burst-1")}, fixed10m),
			refused: "runs.json's lead-in"},
		{name: "refuses a folder without a corpus",
			add: []CorpusRun{planned(t, 1, "traffic-burst-1")}, refused: "no corpus to append to"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.header != nil {
				writeCorpus(t, dir, tc.header, tc.have)
			}
			before, _ := os.ReadFile(filepath.Join(dir, corpusCSV))
			part := filepath.Join(dir, appendPart)
			w, err := createRows(part, false)
			if err != nil {
				t.Fatal(err)
			}
			w.write(rowsOf(tc.add))
			if err := w.close(); err != nil {
				t.Fatal(err)
			}

			err = appendCorpus(dir, 1, tc.leadIn, part, tc.add)

			if tc.refused != "" {
				if err == nil || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("append: %v, want an error saying %q", err, tc.refused)
				}
				if after, _ := os.ReadFile(filepath.Join(dir, corpusCSV)); !bytes.Equal(before, after) {
					t.Error("a refused append changed corpus.csv.gz")
				}
				if _, serr := os.Stat(part); serr != nil {
					t.Errorf("a refused append lost the new rows: %v", serr)
				}
				return
			}
			if err != nil {
				t.Fatalf("append: %v", err)
			}
			all := append(slices.Clone(tc.have), tc.add...)
			if got, want := readRows(t, filepath.Join(dir, corpusCSV)), append([][]string{CorpusHeader}, rowsOf(all)...); !slices.EqualFunc(got, want, slices.Equal) {
				t.Errorf("corpus rows:\n%q\nwant\n%q", got, want)
			}
			b, err := os.ReadFile(filepath.Join(dir, corpusRuns))
			if err != nil {
				t.Fatal(err)
			}
			var runs []CorpusRun
			if err := json.Unmarshal(b, &runs); err != nil {
				t.Fatal(err)
			}
			if !slices.EqualFunc(runs, all, func(a, b CorpusRun) bool { return a.ID == b.ID && a.Seed == b.Seed }) {
				t.Errorf("runs.json has %v, want %v", runs, all)
			}
			if _, err := os.Stat(part); !os.IsNotExist(err) {
				t.Errorf("%s left behind (%v)", appendPart, err)
			}
		})
	}
}

// TestPublishBurstKeepsItsRate plays short bursts against a local Mosquitto:
// the publisher holds the planned rate and every subscriber gets every
// message, at QoS 0 and 1.
func TestPublishBurstKeepsItsRate(t *testing.T) {
	if _, err := os.Stat(testbed.MosquittoPath); err != nil {
		t.Skipf("no Mosquitto: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := testbed.StartMosquitto(ctx, t.TempDir(), "burst-broker", "")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	for _, tc := range []struct {
		name  string
		burst corpus.Burst
	}{
		{"QoS 0 without subscribers", corpus.Burst{Duration: 2 * time.Second, Rate: 1000, Size: 4 << 10}},
		{"QoS 1 to two subscribers", corpus.Burst{Duration: 2 * time.Second, Rate: 1500, Size: 256, QoS: 1, Subscribers: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			onset := time.Now()
			recs, err := publishTraffic(ctx, b.URL(), "test", onset, corpus.Traffic{tc.burst})
			if err != nil || len(recs) != 1 {
				t.Fatalf("publish: %v, %d records", err, len(recs))
			}
			r := recs[0]
			t.Logf("%v: published %d, delivered %d in %v", tc.burst, r.Published, r.Delivered, r.End.Sub(r.Start))
			want := tc.burst.Rate * int(tc.burst.Duration/time.Second)
			// Ticks are 10 ms: the last one may fall just past the end.
			if r.Published < want*95/100 || r.Published > want {
				t.Errorf("published %d, want ≈ %d", r.Published, want)
			}
			if r.Delivered != r.Published*tc.burst.Subscribers {
				t.Errorf("delivered %d, want %d × %d subscribers", r.Delivered, r.Published, tc.burst.Subscribers)
			}
			if d := r.End.Sub(r.Start); d < tc.burst.Duration || d > tc.burst.Duration+time.Second {
				t.Errorf("the burst lasted %v, want %v", d, tc.burst.Duration)
			}
		})
	}
}

var (
	fixed10m = corpus.LeadIn{Min: 10 * time.Minute, Max: 10 * time.Minute}
	upTo10m  = corpus.LeadIn{Max: 10 * time.Minute}
)

// withDrawn returns runs (of seed 1's plan) as Corpus records them with
// --lead-in l: each with the lead-in drawn for it, and the spec.
func withDrawn(t *testing.T, runs []CorpusRun, l corpus.LeadIn) []CorpusRun {
	t.Helper()
	plan, err := corpus.Plan(1, 5)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]corpus.Run{}
	for _, r := range plan {
		byID[r.ID] = r
	}
	out := slices.Clone(runs)
	for i, r := range out {
		p, ok := byID[r.ID]
		if !ok || p.Seed != r.Seed {
			t.Fatalf("%s is not a run of seed 1's plan", r.ID)
		}
		out[i].LeadIn, out[i].LeadInSpec = l.Draw(p).String(), l.String()
	}
	return out
}

// withLeadIn returns runs as recorded with --lead-in d before ranges: the
// lead-in, no spec.
func withLeadIn(runs []CorpusRun, d string) []CorpusRun {
	out := slices.Clone(runs)
	for i := range out {
		out[i].LeadIn = d
	}
	return out
}

func TestCorpusPlanScalesTheProfileNotTheLeadIn(t *testing.T) {
	base, err := corpus.Plan(1, 2, "idle", "traffic-burst")
	if err != nil {
		t.Fatal(err)
	}
	cc := CorpusConfig{Seed: 1, PerFamily: 2, Families: []string{"traffic-burst", "idle"}, Scale: 0.5, LeadIn: upTo10m}
	plan, err := cc.Plan()
	if err != nil {
		t.Fatal(err)
	}
	if len(plan) != len(base) {
		t.Fatalf("%d runs, want %d", len(plan), len(base))
	}
	for i, r := range plan {
		b := base[i]
		if r.ID != b.ID || r.LeadIn != upTo10m.Draw(b) {
			t.Fatalf("run %d: %s with lead-in %v, want %s with %v", i, r.ID, r.LeadIn, b.ID, upTo10m.Draw(b))
		}
		if got, want := r.Profile.Duration(), b.Profile.Duration()/2+r.LeadIn; got != want {
			t.Errorf("%s: %v long, want half of %v plus the lead-in %v", r.ID, got, b.Profile.Duration(), r.LeadIn)
		}
	}
}

func TestCorpusScheduleStartsRunsAsBrokersFreeAndNoneOnceCancelled(t *testing.T) {
	idle := corpus.Run{Profile: stress.Profile{Phases: []stress.Phase{{Duration: time.Minute}}}}
	plan := []corpus.Run{idle, idle, idle, idle}
	s := corpus.NewSchedule(plan, 1, 2, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan int)
	release := make([]chan struct{}, len(plan))
	for i := range release {
		release[i] = make(chan struct{})
	}
	var finished []int // appended by finish, on the loop's goroutine
	done := make(chan struct{})
	go func() {
		defer close(done)
		runCorpusSchedule(ctx, s, func(ctx context.Context, i int, onset func(time.Time)) func() {
			onset(time.Now())
			started <- i
			<-release[i]
			return func() { finished = append(finished, i) }
		})
	}()
	got := []int{<-started, <-started}
	slices.Sort(got)
	if !slices.Equal(got, []int{0, 1}) {
		t.Fatalf("first starts %v, want runs 0 and 1 (two brokers)", got)
	}
	// A third run starts only when a broker is free.
	close(release[0])
	if i := <-started; i != 2 {
		t.Fatalf("after run 0's end, run %d started, want 2", i)
	}
	cancel()
	close(release[1])
	close(release[2])
	<-done
	slices.Sort(finished)
	if !slices.Equal(finished, []int{0, 1, 2}) || s.Left() != 1 {
		t.Errorf("finished %v with %d runs left; want 0, 1, 2 finished and run 3 never started", finished, s.Left())
	}
}

// The committed real-node corpus is what this build plans: the same runs,
// profiles, traffic and drawn lead-ins, with this build's header, so an
// --append to it and a re-recording give the same runs.
func TestCommittedRealNodeCorpusIsThePlanThisBuildMakes(t *testing.T) {
	for _, c := range []struct {
		dir      string
		seed     uint64
		families []string // nil: every family
	}{
		{"real-node", 1, nil},
		// The healthy soak: the held-out healthy families drawn again from
		// another seed, recorded after training (amftrain.py check).
		{"real-node-soak", 2, []string{"mem-high-hold", "idle", "cpu-oscillation", "traffic-burst"}},
		// The second, recorded after the choice of the memory-only default.
		{"real-node-soak-2", 3, []string{"mem-high-hold", "idle", "cpu-oscillation", "traffic-burst"}},
	} {
		t.Run(c.dir, func(t *testing.T) {
			checkCommittedCorpus(t, filepath.Join("..", "corpus", c.dir), CorpusConfig{Seed: c.seed, PerFamily: 5, Families: c.families})
		})
	}
}

// checkCommittedCorpus holds a committed corpus to the plan this build makes
// of cfg with the 0-10m lead-in: the same runs, profiles, traffic and
// lead-ins, each recorded without error and failing as its family does.
func checkCommittedCorpus(t *testing.T, dir string, cfg CorpusConfig) {
	t.Helper()
	leadIn, err := corpus.ParseLeadIn("0-10m")
	if err != nil {
		t.Fatal(err)
	}
	cfg.LeadIn = leadIn
	plan, err := cfg.Plan()
	if err != nil {
		t.Fatal(err)
	}
	recorded, err := readCorpus(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(recorded) != len(plan) {
		t.Fatalf("%s has %d runs, the plan %d", dir, len(recorded), len(plan))
	}
	byID := map[string]CorpusRun{}
	for _, r := range recorded {
		byID[r.ID] = r
	}
	for _, p := range plan {
		r, ok := byID[p.ID]
		switch {
		case !ok:
			t.Errorf("%s: planned, not in %s", p.ID, dir)
		case r.Profile != p.Profile.String() || r.Traffic != p.Traffic.String() || r.LeadIn != p.LeadIn.String() || r.LeadInSpec != leadIn.String():
			t.Errorf("%s: recorded profile %s, traffic %q, lead-in %s of %s; this build plans %s, %q, %v of %v",
				p.ID, r.Profile, r.Traffic, r.LeadIn, r.LeadInSpec, p.Profile, p.Traffic, p.LeadIn, leadIn)
		case r.Error != "" || r.Samples == 0 || (r.Failure != nil) != p.Failing:
			t.Errorf("%s: error %q, %d samples, failure %v (failing family: %v)", p.ID, r.Error, r.Samples, r.Failure, p.Failing)
		}
	}
}
