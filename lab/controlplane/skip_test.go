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

// A test that would start a control plane without its binaries skips, or
// fails where they are required; under -short it skips before looking
// (the quick tests do not start one, required or not).
func TestStartWithoutTheBinaries(t *testing.T) {
	for _, tc := range []struct {
		name    string
		short   bool
		require string
		skipped string // in the skip; "" for a failure
		failed  string // in the failure
		oneLine bool
	}{
		{name: "missing binaries skip", require: "", skipped: "run make k8s", oneLine: true},
		{name: "missing binaries fail when required", require: "1", failed: "run make k8s"},
		{name: "-short skips, also where required", short: true, require: "1", skipped: "not with -short"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setShort(t, tc.short)
			t.Setenv(EnvRequire, tc.require)
			r := startWithout(t)
			switch {
			case tc.skipped != "" && (r.failed != "" || !strings.Contains(r.skipped, tc.skipped)):
				t.Errorf("skipped %q failed %q, want a skip saying %s", r.skipped, r.failed, tc.skipped)
			case tc.failed != "" && (r.skipped != "" || !strings.Contains(r.failed, tc.failed)):
				t.Errorf("skipped %q failed %q, want a failure saying %s", r.skipped, r.failed, tc.failed)
			case tc.oneLine && strings.Contains(r.skipped, "\n"):
				t.Errorf("skip %q is more than one line", r.skipped)
			}
		})
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
