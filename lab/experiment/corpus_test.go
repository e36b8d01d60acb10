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
		leadIn time.Duration // of the added runs
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
		{name: "adds runs recorded with the corpus's lead-in", header: CorpusHeader, have: withLeadIn(old, "10m0s"), leadIn: 10 * time.Minute,
			add: withLeadIn([]CorpusRun{planned(t, 1, "traffic-burst-1")}, "10m0s")},
		{name: "refuses runs with another lead-in than the corpus's", header: CorpusHeader, have: old, leadIn: 10 * time.Minute,
			add: withLeadIn([]CorpusRun{planned(t, 1, "traffic-burst-1")}, "10m0s"), refused: "--lead-in 0s, not 10m0s"},
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

// withLeadIn returns runs as recorded with --lead-in d.
func withLeadIn(runs []CorpusRun, d string) []CorpusRun {
	out := slices.Clone(runs)
	for i := range out {
		out[i].LeadIn = d
	}
	return out
}
