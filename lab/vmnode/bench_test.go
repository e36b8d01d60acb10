package vmnode_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
	"github.com/amf-edge/amf/lab/testbed"
	"github.com/amf-edge/amf/lab/vmnode"
	"github.com/amf-edge/amf/ociimage"
)

// TestSignalBenchInTheGuest is `make bench-v2node`: the signal benchmark
// (`amf-lab bench signal --mode sidecar`: a broker crashed and OOM-killed
// beside a real sidecar and agent, the sidecar crashed and frozen, against
// a kubelet-style poller) run as root inside the cgroup v2 guest node, its
// table logged. It is a benchmark, not a timed test: it fails only when
// the benchmark cannot run. Set AMF_VMNODE_BENCH=1 to run it (≈ 5 min).
func TestSignalBenchInTheGuest(t *testing.T) {
	if os.Getenv("AMF_VMNODE_BENCH") != "1" {
		t.Skip("the signal benchmark in the guest node runs with make bench-v2node (AMF_VMNODE_BENCH=1)")
	}
	require(t)
	imgs := kubenodetest.Images(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, t, controlplane.Options{NoFakeNodes: true})
	if err != nil {
		t.Fatal(err)
	}
	repo, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	// amf-lab finds amf-sidecar and amf-agent beside itself; without
	// Mosquitto in the guest it runs a mochi broker.
	cfg := vmnode.Config{ControlPlane: cp, Repo: repo, Log: t.Logf, Files: map[string]string{}}
	bin := t.TempDir()
	if err := ociimage.GoBuild(ctx, "", repo, "amd64", bin, "./cmd/amf-lab", "./cmd/amf-sidecar", "./cmd/amf-agent"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"amf-lab", "amf-sidecar", "amf-agent"} {
		cfg.Files["bin/"+c] = filepath.Join(bin, c)
	}
	for _, im := range imgs {
		cfg.Images = append(cfg.Images, im.Archive)
	}
	n, err := vmnode.Launch(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	out, err := n.Run(ctx, "/amf/bin/amf-lab", "bench", "signal", "--mode", "sidecar", "--runs", "5")
	t.Logf("amf-lab bench signal --mode sidecar --runs 5, in the guest (kernel %s, %s):\n%s", n.Guest["kernel"], n.Guest["cgroup"], out)
	if err != nil {
		t.Fatal(err)
	}
}
