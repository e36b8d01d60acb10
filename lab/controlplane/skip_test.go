package controlplane

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// recordTB stops at Skipf/Fatalf like testing.T does, and records the message.
type recordTB struct {
	testing.TB
	skipped, failed string
}

func (r *recordTB) Helper() {}
func (r *recordTB) Skipf(format string, args ...any) {
	r.skipped = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recordTB) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// setShort sets -short for the rest of t (package testing reads the flag
// at each testing.Short, Start reads it at each call).
func setShort(t *testing.T, on bool) {
	was := flag.Lookup("test.short").Value.String()
	if err := flag.Set("test.short", fmt.Sprint(on)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = flag.Set("test.short", was) })
}

func startWithout(t *testing.T) *recordTB {
	t.Setenv(EnvBin, t.TempDir()) // an empty folder
	r := &recordTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = Start(context.Background(), r, Options{})
		t.Error("Start returned without binaries")
	}()
	<-done
	return r
}

func TestMissingBinariesSkip(t *testing.T) {
	setShort(t, false)
	t.Setenv(EnvRequire, "")
	r := startWithout(t)
	if r.failed != "" || !strings.Contains(r.skipped, "run make k8s") || strings.Contains(r.skipped, "\n") {
		t.Errorf("skipped %q failed %q, want one skip line saying run make k8s", r.skipped, r.failed)
	}
}

func TestMissingBinariesFailWhenRequired(t *testing.T) {
	setShort(t, false)
	t.Setenv(EnvRequire, "1")
	r := startWithout(t)
	if r.skipped != "" || !strings.Contains(r.failed, "run make k8s") {
		t.Errorf("skipped %q failed %q, want a failure saying run make k8s", r.skipped, r.failed)
	}
}

// -short skips a test that would start a control plane, also where the
// binaries are required (they are, but the quick tests do not start it).
func TestShortSkipsAControlPlane(t *testing.T) {
	setShort(t, true)
	t.Setenv(EnvRequire, "1")
	r := startWithout(t)
	if r.failed != "" || !strings.Contains(r.skipped, "not with -short") {
		t.Errorf("skipped %q failed %q, want a skip saying not with -short", r.skipped, r.failed)
	}
}

func TestPinnedVersion(t *testing.T) {
	repo, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	v, err := pinnedVersion(repo + "/tools/k8s/go.mod")
	if err != nil || !strings.HasPrefix(v, "v1.") {
		t.Fatalf("pinnedVersion = %q, %v", v, err)
	}
	t.Setenv(EnvBin, "")
	t.Setenv(EnvCache, "/somewhere")
	if d, err := BinDir(); err != nil || d != "/somewhere/"+v+"/bin" {
		t.Errorf("BinDir with %s=/somewhere: %q, %v", EnvCache, d, err)
	}
}
