// Package kubenodetest starts a control plane and a real node for a test:
// lab/controlplane's API server with lab/kubenode's kubelet + containerd, the
// lab's images imported. What is missing on the machine skips the test with
// one line saying what to run, or fails it where AMF_REQUIRE_NODE=1.
package kubenodetest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode"
)

// Options configures Start.
type Options struct {
	// Node is passed to kubenode.Launch (ControlPlane and Images are set here).
	Node kubenode.Config
	// ControlPlane is passed to controlplane.Start (ServingIPs are added).
	ControlPlane controlplane.Options
}

// Start returns a running control plane and node, and stops both (the node
// first) when the test ends; their logs go to the test log if it failed.
func Start(t testing.TB, opts Options) (*controlplane.ControlPlane, *kubenode.Node) {
	t.Helper()
	Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	imgs := Images(t)
	opts.ControlPlane.ServingIPs = append(opts.ControlPlane.ServingIPs, kubenode.ServingIPs()...)
	cp, err := controlplane.Start(ctx, t, opts.ControlPlane)
	if err != nil {
		t.Fatalf("control plane: %v", err)
	}
	cfg := opts.Node
	cfg.ControlPlane = cp
	for _, im := range imgs {
		cfg.Images = append(cfg.Images, im.Archive)
	}
	if cfg.Log == nil {
		cfg.Log = t.Logf
	}
	n, err := kubenode.Launch(ctx, cfg)
	if err != nil {
		t.Fatalf("node: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			n.DumpLogs()
		}
		n.Stop()
	})
	return cp, n
}

// Require skips the test (fails it with AMF_REQUIRE_NODE=1) unless this
// machine can run a node and its control plane is built.
func Require(t testing.TB) {
	t.Helper()
	fail := t.Skipf
	if os.Getenv(kubenode.EnvRequire) == "1" {
		fail = t.Fatalf
	}
	if err := kubenode.Check(); err != nil {
		fail("no real node here (%v)", err)
	}
	bin, err := controlplane.BinDir()
	if err == nil {
		_, err = os.Stat(filepath.Join(bin, "kubelet"))
	}
	if err != nil {
		fail("Kubernetes node binaries not built (%v): run make k8s", err)
	}
}

// Images builds the lab's images (cached per machine) for the module the test
// runs in. Each archive is hard-linked into the test's temporary folder at
// once, and the links are returned: the shared cache is pruned by whichever
// clone on the machine builds a newer archive, and an import minutes later
// must not find its file gone.
func Images(t testing.TB) []images.Image {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var imgs []images.Image
		if imgs, err = images.Build(ctx, images.Options{}); err != nil {
			break
		}
		if err = linkInto(dir, imgs); err == nil {
			return imgs
		}
	}
	t.Fatalf("images: %v", err)
	return nil
}

// linkInto hard-links every image's archive into dir and points it there.
func linkInto(dir string, imgs []images.Image) error {
	for i := range imgs {
		p := filepath.Join(dir, filepath.Base(imgs[i].Archive))
		_ = os.Remove(p)
		if err := os.Link(imgs[i].Archive, p); err != nil {
			return fmt.Errorf("keep %s for the test: %w", imgs[i].Archive, err)
		}
		imgs[i].Archive = p
	}
	return nil
}

// StartCluster returns a running control plane and a cluster of nodes on one
// LAN (kubenode.LaunchCluster), stopped (nodes, LAN, then the control plane)
// when the test ends; their logs go to the test log if it failed.
func StartCluster(t testing.TB, nodes int, opts Options) (*controlplane.ControlPlane, *kubenode.Cluster) {
	t.Helper()
	Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	imgs := Images(t)
	opts.ControlPlane.ServingIPs = append(opts.ControlPlane.ServingIPs, kubenode.ServingIPs()...)
	opts.ControlPlane.NoFakeNodes = true
	cp, err := controlplane.Start(ctx, t, opts.ControlPlane)
	if err != nil {
		t.Fatalf("control plane: %v", err)
	}
	cfg := opts.Node
	for _, im := range imgs {
		cfg.Images = append(cfg.Images, im.Archive)
	}
	if cfg.Log == nil {
		cfg.Log = t.Logf
	}
	c, err := kubenode.LaunchCluster(ctx, kubenode.ClusterConfig{ControlPlane: cp, Nodes: nodes, Node: cfg})
	if err != nil {
		t.Fatalf("cluster: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.DumpLogs()
		}
		c.Stop()
	})
	return cp, c
}

// PodReady says the pod's Ready condition is true.
func PodReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// WaitPod watches the pods of ns matching selector until one, not being
// deleted, satisfies ok, and returns it; it fails t with the pods as they
// are when ctx ends first.
func WaitPod(ctx context.Context, t testing.TB, cs kubernetes.Interface, ns, selector string, ok func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	lw := cache.NewFilteredListWatchFromClient(cs.CoreV1().RESTClient(), "pods", ns, func(o *metav1.ListOptions) { o.LabelSelector = selector })
	ev, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		p, isPod := ev.Object.(*corev1.Pod)
		return isPod && ev.Type != watch.Deleted && p.DeletionTimestamp == nil && ok(p), nil
	})
	if err != nil {
		pods, _ := cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
		b, _ := json.MarshalIndent(pods, "", " ")
		t.Fatalf("no pod %s in %s: %v\n%s", selector, ns, err, b)
	}
	return ev.Object.(*corev1.Pod)
}
