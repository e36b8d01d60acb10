package experiment

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/amf-edge/amf/lab/bench"
	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/testbed"
)

// requireLab skips (fails with AMF_REQUIRE_K8S=1) where the experiment cannot run.
func requireLab(t *testing.T) (bench.Binaries, string) {
	t.Helper()
	fail := t.Skipf
	if os.Getenv(controlplane.EnvRequire) == "1" {
		fail = t.Fatalf
	}
	if err := CanRun(); err != nil {
		fail("experiment cannot run here: %v", err)
	}
	if _, err := controlplane.BinDir(); err != nil {
		fail("Kubernetes control plane not built (%v): run make k8s", err)
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
// paper's fault at 1/4 length and checks what must hold whatever the timings:
// AMF retires the primary only after the standby is Ready and no OOM happens;
// the reactive broker is OOM-killed and restarted.
func TestScaledExperimentStructure(t *testing.T) {
	bins, repo := requireLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	var res *Results
	// The pods run as their own users (1883, 65532): their state must be
	// reachable by them, which t.TempDir's 0700 folders are not.
	out, err := os.MkdirTemp("", "amf-experiment-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(out) })
	if err := os.Chmod(out, 0o755); err != nil {
		t.Fatal(err)
	}
	res, err = Run(ctx, Config{
		Modes: []Mode{AMF, Reactive}, Runs: 1, Fault: PaperFault.Scaled(0.25), Tail: 10 * time.Second,
		Out: out, Repo: repo, Bin: bins, Progress: testWriter{t},
	})
	if err != nil {
		t.Fatalf("experiment: %v", err)
	}
	if len(res.Runs) != 2 {
		t.Fatalf("%d runs, want 2", len(res.Runs))
	}
	amf, reactive := res.Runs[0], res.Runs[1]
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
	if !reactive.OOMKilled {
		t.Errorf("reactive run: no OOM kill")
	}
	if reactive.Restarts < 1 {
		t.Errorf("reactive run: %d restarts, want ≥ 1", reactive.Restarts)
	}
	for _, f := range []string{"results.json", "summary.md", "sot.svg", "timeline.svg"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("result file %s missing or empty (%v)", f, err)
		}
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
