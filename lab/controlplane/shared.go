package controlplane

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Shared is one control plane for the tests of a package, as Kubernetes' own
// integration tests share an API server: the first test that asks for it
// starts it, later ones (and the later runs of -count=N) reuse it, and the
// package's TestMain stops it after the last. Starting a control plane costs
// about 4 s and a few CPU-seconds; a package of ten real-API tests run 50
// times would spend most of its time there.
//
// A test on it keeps to a namespace of its own (Namespace), names its
// cluster-scoped objects after that namespace, and leaves the components
// alone: a test that stops or restarts one starts its own control plane
// with Start.
type Shared struct {
	// Options are the options of Start (NoFakeNodes, Nodes, flags, ...).
	Options Options

	once sync.Once
	cp   *ControlPlane
	dir  string
	err  error

	mu sync.Mutex
	n  int // namespaces handed out
}

// Get returns the running control plane, starting it on the first call.
// Missing binaries skip tb (fail it with AMF_REQUIRE_K8S=1), as in Start; a
// failed start fails every test that asks, with the first start's error.
func (s *Shared) Get(ctx context.Context, tb TB) *ControlPlane {
	tb.Helper()
	if s.Options.BinDir == "" {
		binDirOrSkip(tb)
	}
	s.once.Do(func() {
		if s.dir, s.err = os.MkdirTemp("", "amf-controlplane-"); s.err != nil {
			return
		}
		// The components outlive the test that started them: they log to
		// stderr, not to that test's log.
		// Not bounded by the asking test's deadline: the start serves
		// every test (Options.StartTimeout bounds it).
		s.cp, s.err = Launch(context.WithoutCancel(ctx), s.dir, s.Options, func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, format+"\n", args...)
		})
		if s.err != nil {
			os.RemoveAll(s.dir)
		}
	})
	if s.err != nil {
		tb.Fatalf("shared control plane: %v", s.err)
	}
	return s.cp
}

// Namespace creates a namespace of its own for tb on the shared control
// plane, named prefix-<n>, and deletes it (with everything in it) when tb
// ends. The Deployments go at once, so that the next test's agent, which may
// list every namespace, finds none of this test's switchovers; the rest goes
// with the namespace, in the background.
func (s *Shared) Namespace(ctx context.Context, tb TB, prefix string) string {
	tb.Helper()
	cp := s.Get(ctx, tb)
	s.mu.Lock()
	s.n++
	name := fmt.Sprintf("%s-%d", strings.TrimSuffix(prefix, "-"), s.n)
	s.mu.Unlock()
	cs := cp.Client()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("shared control plane: namespace %s: %v", name, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := cs.AppsV1().Deployments(name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			tb.Logf("shared control plane: deleting the Deployments of %s: %v", name, err)
		}
		if err := cs.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			tb.Logf("shared control plane: deleting namespace %s: %v", name, err)
		}
	})
	return name
}

// Stop stops the control plane if it was started, printing its components'
// logs first when failed (TestMain: m.Run's code was not 0), and removes its
// folder. Call it once, after the last test.
func (s *Shared) Stop(failed bool) {
	if s.cp == nil {
		return
	}
	if failed {
		s.cp.DumpLogs()
	}
	s.cp.Stop()
	os.RemoveAll(s.dir)
}
