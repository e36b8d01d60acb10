package experiment

import (
	"compress/gzip"
	"context"
	"encoding/csv"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/lab/bench"
	"github.com/amf-edge/amf/lab/corpus"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
	"github.com/amf-edge/amf/lab/testbed"
)

// requireLab skips (fails with AMF_REQUIRE_NODE=1) where the experiment
// cannot run: it needs a real node.
func requireLab(t *testing.T) (bench.Binaries, string) {
	t.Helper()
	kubenodetest.Require(t)
	fail := t.Skipf
	if os.Getenv(kubenode.EnvRequire) == "1" {
		fail = t.Fatalf
	}
	repo, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(repo, "bin")
	b := bench.Binaries{Sidecar: filepath.Join(bin, "amf-sidecar"), Agent: filepath.Join(bin, "amf-agent"), Self: filepath.Join(bin, "amf-lab"), Mosquitto: testbed.MosquittoPath}
	for _, p := range []string{b.Sidecar, b.Agent, b.Self, b.Mosquitto} {
		if _, err := os.Stat(p); err != nil {
			fail("%v: run make build (and make deps for Mosquitto)", err)
		}
	}
	return b, repo
}

// TestScaledExperimentStructure runs one AMF run and one reactive run of the
// paper's fault at 0.3 of its length, and a short healthy run, and checks
// what must hold whatever the timings: AMF retires the primary only after
// the standby is ready and no OOM happens, and its pair, a stateful one,
// carries the broker's state (a planned switchover: nothing lost, nothing
// twice); the reactive broker is OOM-killed and restarted; the healthy run
// switches nothing.
func TestScaledExperimentStructure(t *testing.T) {
	bins, repo := requireLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	out := t.TempDir()
	res, err := Run(ctx, Config{
		Modes: []Mode{AMF, Reactive, Healthy}, Runs: 1, Fault: PaperFault.Scaled(0.3), Tail: 10 * time.Second,
		Healthy: 45 * time.Second,
		Out:     out, Repo: repo, Bin: bins, Progress: testWriter{t},
	})
	if err != nil {
		t.Fatalf("experiment: %v", err)
	}
	if len(res.Runs) != 3 {
		t.Fatalf("%d runs, want 3", len(res.Runs))
	}
	amf, reactive, healthy := res.Runs[0], res.Runs[1], res.Runs[2]
	t.Logf("amf: %s", amf.Line())
	t.Logf("reactive: %s", reactive.Line())
	if amf.OOMKilled {
		t.Errorf("AMF run: the broker was OOM-killed (at %+.1f s); the switchover should have come first", *amf.OOM)
	}
	switch {
	case amf.StandbyReady == nil:
		t.Errorf("AMF run: the standby never became Ready")
	case amf.PrimaryRetired == nil:
		t.Errorf("AMF run: the primary was never retired")
	case *amf.PrimaryRetired < *amf.StandbyReady:
		t.Errorf("AMF run: primary retired at %+.1f s before the standby was Ready at %+.1f s", *amf.PrimaryRetired, *amf.StandbyReady)
	}
	if amf.Detection == nil || amf.Confirmation == nil || *amf.Confirmation < *amf.Detection {
		t.Errorf("AMF run: detection %v, confirmation %v: want both, detection first", amf.Detection, amf.Confirmation)
	}
	// The final state, written as the retired broker stops, is all the
	// new primary starts from, and no client reaches it before.
	switch c := amf.StateCheck; {
	case c == nil:
		t.Errorf("AMF run: the new primary's state was not checked: %s", amf.StateError)
	case !c.lossless():
		t.Errorf("AMF run: the new primary held %s; want everything, none twice (the agent: %q)", c.text(), amf.StateNotes)
	}
	switch {
	case amf.StateCarried == nil || amf.NewPrimaryReady == nil || amf.SwitchoverComplete == nil:
		t.Errorf("AMF run: state carried %v, new primary Ready %v, switchover complete %v: want all three (the agent: %q)",
			amf.StateCarried, amf.NewPrimaryReady, amf.SwitchoverComplete, amf.StateNotes)
	case amf.PrimaryRetired != nil && (*amf.StateCarried < *amf.PrimaryRetired || *amf.SwitchoverComplete < *amf.NewPrimaryReady):
		t.Errorf("AMF run: retired %+.1f s, state carried %+.1f s, new primary Ready %+.1f s, complete %+.1f s: want them in that order",
			*amf.PrimaryRetired, *amf.StateCarried, *amf.NewPrimaryReady, *amf.SwitchoverComplete)
	}
	// The model's explanation travels from the sidecar's score through the
	// signal to the agent's decision (P1's trees: Saabas contributions).
	if !strings.Contains(amf.Explanation, "Saabas") {
		t.Errorf("AMF run: the scale-up decision says %q of what drove it, want the trees' contributions", amf.Explanation)
	}
	if !reactive.OOMKilled {
		t.Errorf("reactive run: no OOM kill")
	}
	if reactive.Restarts < 1 {
		t.Errorf("reactive run: %d restarts, want ≥ 1", reactive.Restarts)
	}
	if healthy.Switchovers != 0 || healthy.MaxProbability >= 0.5 {
		t.Errorf("healthy run: %d switchovers, max probability %.3f; want none below the threshold", healthy.Switchovers, healthy.MaxProbability)
	}
	for _, f := range []string{"results.json", "summary.md", "sot.svg", "timeline.svg"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("result file %s missing or empty (%v)", f, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(out, "results.json")); err != nil || !strings.Contains(string(b), `"state_retained_lost": 0`) || !strings.Contains(string(b), `"switchover_complete_s"`) {
		t.Errorf("results.json has no state figures (%v)", err)
	}
}

// TestScaledExperimentInNodeMode runs the same AMF run in node mode (no
// sidecar: the agent from overlays/node-mode runs the pipeline) and checks
// the same: the switchover comes before any OOM kill and retires the primary
// only after the standby is Ready; the result names the mode.
func TestScaledExperimentInNodeMode(t *testing.T) {
	bins, repo := requireLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	res, err := Run(ctx, Config{
		Modes: []Mode{AMFNode}, Runs: 1, Fault: PaperFault.Scaled(0.3), Tail: 10 * time.Second,
		Out: t.TempDir(), Repo: repo, Bin: bins, Progress: testWriter{t},
	})
	if err != nil {
		t.Fatalf("experiment: %v", err)
	}
	if len(res.Runs) != 1 || res.Runs[0].Mode != AMFNode {
		t.Fatalf("runs %+v, want one in mode %s", res.Runs, AMFNode)
	}
	r := res.Runs[0]
	t.Logf("amf-node: %s", r.Line())
	if r.OOMKilled {
		t.Errorf("the broker was OOM-killed (at %+.1f s); the switchover should have come first", *r.OOM)
	}
	switch {
	case r.StandbyReady == nil:
		t.Errorf("the standby never became Ready")
	case r.PrimaryRetired == nil:
		t.Errorf("the primary was never retired")
	case *r.PrimaryRetired < *r.StandbyReady:
		t.Errorf("primary retired at %+.1f s before the standby was Ready at %+.1f s", *r.PrimaryRetired, *r.StandbyReady)
	}
	if r.Detection == nil || r.Confirmation == nil || *r.Confirmation < *r.Detection {
		t.Errorf("detection %v, confirmation %v: want both, detection first", r.Detection, r.Confirmation)
	}
}

// TestScaledExperimentResizesInPlaceFirst runs the amf-resize modes side by
// side at a quarter of the staged fault's length and checks each branch as
// the agent's Events tell it: under the staged fault with room for it, the
// broker's limit is raised in place, with no switchover and no OOM kill; on a
// node without the room the kubelet defers the resize and the agent switches
// over, retiring the primary only after the standby is Ready; under a leak no
// ceiling absorbs, a switchover is decided.
func TestScaledExperimentResizesInPlaceFirst(t *testing.T) {
	bins, repo := requireLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	out := t.TempDir()
	res, err := Run(ctx, Config{
		Modes: []Mode{AMFResize, AMFResizeNoRoom, AMFResizeLeak}, Runs: 1, Fault: PaperFault.Scaled(0.25), Tail: 10 * time.Second,
		Out: out, Repo: repo, Bin: bins, Progress: testWriter{t},
	})
	if err != nil {
		t.Fatalf("experiment: %v", err)
	}
	if len(res.Runs) != 3 || res.ResizeCeiling == "" {
		t.Fatalf("%d runs, ceiling %q: want 3 runs and the ceiling recorded", len(res.Runs), res.ResizeCeiling)
	}
	resize, noRoom, leak := res.Runs[0], res.Runs[1], res.Runs[2]
	for _, r := range res.Runs {
		t.Logf("%s: %s; %q %s", r.Mode, r.Line(), r.ResizeNotes, r.SwitchoverNote)
	}
	if resize.Resized == nil || resize.Confirmation != nil || resize.OOMKilled {
		t.Errorf("amf-resize: resized at %v, switchover decided at %v, OOM %v: want a resize in place and neither of the others (%s)",
			resize.Resized, resize.Confirmation, resize.OOMKilled, resize.SwitchoverNote)
	}
	if noRoom.ResizeDecided == nil || noRoom.Resized != nil || !strings.Contains(noRoom.SwitchoverNote, "Deferred") {
		t.Errorf("amf-resize-noroom: resize decided at %v, resized at %v, %q: want a resize the kubelet deferred, then a switchover",
			noRoom.ResizeDecided, noRoom.Resized, noRoom.SwitchoverNote)
	}
	switch {
	case noRoom.StandbyReady == nil || noRoom.PrimaryRetired == nil:
		t.Errorf("amf-resize-noroom: standby Ready %v, primary retired %v: want the switchover completed", noRoom.StandbyReady, noRoom.PrimaryRetired)
	case *noRoom.PrimaryRetired < *noRoom.StandbyReady:
		t.Errorf("amf-resize-noroom: primary retired at %+.1f s before the standby was Ready at %+.1f s", *noRoom.PrimaryRetired, *noRoom.StandbyReady)
	}
	if leak.Confirmation == nil {
		t.Errorf("amf-resize-leak: no switchover decided (%q)", leak.ResizeNotes)
	}
	b, err := os.ReadFile(filepath.Join(out, "summary.md"))
	if err != nil || !strings.Contains(string(b), "Resize in place first") {
		t.Errorf("summary.md has no resize table (%v)", err)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// TestCorpusRecordsTheFailure runs one short "spike" profile (a sudden
// allocation over the limit) and checks the corpus: the OOM kill is recorded,
// samples stop at it, and the last samples are labelled as within the horizon.
func TestCorpusRecordsTheFailure(t *testing.T) {
	bins, repo := requireLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out := t.TempDir()
	cc := CorpusConfig{Seed: 3, Families: []string{"spike"}, Scale: 0.3, Parallel: 1, LeadIn: corpus.LeadIn{Max: 20 * time.Second},
		Base: Config{Out: out, Repo: repo, Bin: bins, Progress: testWriter{t}}}
	plan, err := cc.Plan()
	if err != nil {
		t.Fatal(err)
	}
	runs, err := Corpus(ctx, cc)
	if err != nil {
		t.Fatalf("corpus: %v", err)
	}
	if len(runs) != 1 || runs[0].Failure == nil || runs[0].FailureKind != "oom-killed" {
		t.Fatalf("runs = %+v, want one run ending in an OOM kill", runs)
	}
	if g := runs[0].MaxSampleGap; g < 0.5 {
		t.Errorf("largest gap between samples %v s, want the sampler's 1 s or more", g)
	}
	// The kill's time comes from the cgroup's OOM watch, not the kubelet's
	// FinishedAt, which the API truncates to the second.
	if f := runs[0].Failure; f.Nanosecond() == 0 {
		t.Errorf("failure at %v: whole seconds, want the OOM watch's time", f)
	}
	if r := runs[0]; r.LeadIn != plan[0].LeadIn.String() || r.LeadInSpec != "0s-20s" || r.Profile != plan[0].Profile.String() {
		t.Errorf("run recorded lead-in %q of %q, profile %s; want the planned %v of 0s-20s, %s", r.LeadIn, r.LeadInSpec, r.Profile, plan[0].LeadIn, plan[0].Profile)
	}
	f, err := os.Open(filepath.Join(out, "corpus.csv.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(zr).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rows[0], CorpusHeader) {
		t.Fatalf("header %q, want %q", rows[0], CorpusHeader)
	}
	rows = rows[1:]
	if len(rows) < 5 || len(rows) != runs[0].Samples {
		t.Fatalf("%d rows, run says %d samples; want ≥ 5 and equal", len(rows), runs[0].Samples)
	}
	last := rows[len(rows)-1]
	ttf, err := strconv.ParseFloat(last[9], 64)
	if err != nil || ttf < 0 || ttf > 2 || last[10] != "1" {
		t.Errorf("last sample: time to failure %q, label %q; want within 2 s of the kill and labelled 1", last[9], last[10])
	}
	if first := rows[0]; first[10] != "1" && first[10] != "0" {
		t.Errorf("label %q", first[10])
	}
	// The pod has a network namespace of its own on the real node: its
	// counter is the broker's own traffic (the E2E probe's messages, bridged),
	// which grows during the run.
	n0, err0 := strconv.ParseFloat(rows[0][6], 64)
	n1, err1 := strconv.ParseFloat(last[6], 64)
	if err0 != nil || err1 != nil || n1 <= n0 {
		t.Errorf("network_bytes_total %q at the first sample, %q at the last; want a counter that grows", rows[0][6], last[6])
	}
}
