package vmnode_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
	"github.com/amf-edge/amf/lab/testbed"
	"github.com/amf-edge/amf/lab/vmnode"
)

// start boots a control plane and a guest node for t; both stop at its end.
func start(t *testing.T, forward ...int) (*controlplane.ControlPlane, *vmnode.Node) {
	t.Helper()
	return startWith(t, nil, forward...)
}

// startWith is start with files put on the guest's run disk (Config.Files).
func startWith(t *testing.T, files map[string]string, forward ...int) (*controlplane.ControlPlane, *vmnode.Node) {
	t.Helper()
	require(t)
	imgs := kubenodetest.Images(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, t, controlplane.Options{NoFakeNodes: true})
	if err != nil {
		t.Fatalf("control plane: %v", err)
	}
	repo, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cfg := vmnode.Config{ControlPlane: cp, Repo: repo, Forward: forward, Files: files, Log: t.Logf}
	for _, im := range imgs {
		cfg.Images = append(cfg.Images, im.Archive)
	}
	began := time.Now()
	n, err := vmnode.Launch(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("node %s Ready %.1fs after the boot began: kubelet %s, %s, guest %v", n.Name, time.Since(began).Seconds(), n.KubeletVersion, n.RuntimeVersion, n.Guest)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the guest's console ends with:\n%s", n.ConsoleTail(16<<10))
			diagnose(t, n)
		}
		n.Stop()
	})
	return cp, n
}

// diagnose logs the guest's network and its units' last lines.
func diagnose(t *testing.T, n *vmnode.Node) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range [][]string{
		{"/usr/sbin/ip", "addr"}, {"/usr/sbin/ip", "route"}, {"/usr/sbin/iptables-save"},
		{"/usr/bin/systemctl", "--failed", "--no-pager"},
		{"/usr/bin/journalctl", "-u", "containerd", "-u", "kubelet", "-n", "80", "--no-pager", "-o", "cat"},
	} {
		out, err := n.Run(ctx, c[0], c[1:]...)
		t.Logf("guest: %s (%v):\n%s", strings.Join(c, " "), err, out)
	}
}

// require skips t where the host cannot run a guest node, or fails it with
// AMF_REQUIRE_VMNODE=1 (CI).
func require(t *testing.T) {
	t.Helper()
	fail := t.Skipf
	if os.Getenv("AMF_REQUIRE_VMNODE") == "1" {
		fail = t.Fatalf
	}
	if testing.Short() {
		t.Skip("a guest node takes minutes to boot under TCG")
	}
	if err := vmnode.Check(); err != nil {
		fail("%v", err)
	}
	kubenodetest.Require(t)
}
