package kubenode_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode/kubenodetest"
)

// TestLeftoversNamesWhatNoPodOwns: a running pod and a pod deleted the
// ordinary way leave nothing to report; a container running behind the
// kubelet's back under a pod UID the API server does not know, a second run
// of a running pod's container, and a pod address reserved for a sandbox
// that does not run, are reported.
func TestLeftoversNamesWhatNoPodOwns(t *testing.T) {
	cp, n := kubenodetest.Start(t, kubenodetest.Options{})
	c := cp.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	check := func(when string, want ...string) {
		t.Helper()
		left, err := n.Leftovers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(left) != len(want) {
			t.Fatalf("%s: leftovers %q, want %d matching %q", when, left, len(want), want)
		}
		for i, w := range want {
			if !strings.Contains(left[i], w) {
				t.Errorf("%s: leftover %q, want it to name %q", when, left[i], w)
			}
		}
	}
	var kept string
	for _, name := range []string{"kept", "deleted"} {
		p := pod(name, n.Name, images.MosquittoRef, nil)
		if _, err := c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if got := waitPod(t, c, p.Name, time.Minute, "running", running); name == "kept" {
			kept = string(got.UID)
		}
	}
	check("two running pods")
	if err := c.CoreV1().Pods(metav1.NamespaceDefault).Delete(ctx, "deleted", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	lw := cache.NewListWatchFromClient(c.CoreV1().RESTClient(), "pods", metav1.NamespaceDefault, fields.OneTermEqualSelector("metadata.name", "deleted"))
	if _, err := watchtools.UntilWithSync(ctx, lw, nil, func(store cache.Store) (bool, error) { return len(store.List()) == 0, nil },
		func(ev watch.Event) (bool, error) { return ev.Type == watch.Deleted, nil }); err != nil {
		t.Fatalf("pod deleted not gone: %v", err)
	}
	check("a pod deleted")

	// A container the kubelet does not know: started with ctr inside the
	// node's mount namespace (ctr's FIFOs must be where the shim is), in a
	// cgroup under the node's root, so the janitor removes it too.
	nsenter := []string{"--target", strings.TrimSuffix(strings.TrimPrefix(n.NetNS, "/proc/"), "/ns/net"), "--mount", "--"}
	ctr := func(args ...string) {
		t.Helper()
		cmd := exec.CommandContext(ctx, "nsenter", append(nsenter, append([]string{"ctr", "--address", n.Socket, "--namespace", "k8s.io"}, args...)...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("ctr %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	ctr("run", "-d", "--null-io", "--snapshotter", "overlayfs", "--cgroup", "/"+n.Cgroup+"/stray",
		"--label", "io.kubernetes.pod.uid=00000000-0000-0000-0000-00000000beef", "--label", "io.cri-containerd.kind=container",
		images.PauseRef, "stray")
	// And one that claims to be the kept pod's container main: a second run
	// of a container the pod runs already.
	ctr("run", "-d", "--null-io", "--snapshotter", "overlayfs", "--cgroup", "/"+n.Cgroup+"/twin",
		"--label", "io.kubernetes.pod.uid="+kept, "--label", "io.kubernetes.pod.namespace=default", "--label", "io.kubernetes.pod.name=kept",
		"--label", "io.kubernetes.container.name=main", "--label", "io.cri-containerd.kind=container",
		images.PauseRef, "twin")
	defer func() {
		for _, id := range []string{"stray", "twin"} {
			_, _ = n.Ctr(context.Background(), "tasks", "delete", "--force", id)
			_, _ = n.Ctr(context.Background(), "containers", "delete", id)
		}
	}()
	// An address reserved for a sandbox that is not running (as a runtime
	// killed between the CNI ADD and its own record of the sandbox leaves one).
	reservations := filepath.Join("/proc", nsenter[1], "root/var/lib/cni/networks/amf-lab")
	if err := os.WriteFile(filepath.Join(reservations, "10.214.99.99"), []byte("0123456789abcdef0123\r\neth0"), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(filepath.Join(reservations, "10.214.99.99"))
	check("a stray container, a twin and an address", `container "main" running 2 times in one pod`,
		"pod address 10.214.99.99 reserved for sandbox 0123456789ab", "running container stray")
}
