package sidecar

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amf-edge/amf/cgroup"
	"github.com/amf-edge/amf/infer/model"
	"github.com/amf-edge/amf/podsignal"
)

// oomCgroup creates a cgroup limited to 64 MiB (v1: in the cpuacct, memory
// and blkio hierarchies; v2: one directory), removed at cleanup, and returns
// the directory to open and the cgroup.procs files to join. Without root
// or cgroups it skips, or fails where AMF_REQUIRE_REAL_CGROUPS=1.
func oomCgroup(t *testing.T) (open string, procs []string) {
	t.Helper()
	skip := func(why string) {
		if os.Getenv("AMF_REQUIRE_REAL_CGROUPS") == "1" {
			t.Fatalf("AMF_REQUIRE_REAL_CGROUPS=1, but: %s", why)
		}
		t.Skip("skip: " + why)
	}
	if os.Geteuid() != 0 {
		skip("creating real cgroups needs root")
	}
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatal(err)
	}
	sweepTestCgroups(t)
	name := testCgroupPrefix + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(rnd[:])
	const limit = "67108864"
	var dirs []string
	t.Cleanup(func() {
		for _, d := range dirs {
			if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
				t.Errorf("remove cgroup %s: %v", d, err)
			}
		}
	})
	mk := func(d string) {
		t.Helper()
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, d)
	}
	if _, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err == nil {
		for _, ctrl := range []string{"cpuacct", "memory", "blkio"} {
			mk(filepath.Join("/sys/fs/cgroup", ctrl, name))
			procs = append(procs, filepath.Join("/sys/fs/cgroup", ctrl, name, "cgroup.procs"))
		}
		if err := os.WriteFile(filepath.Join("/sys/fs/cgroup/memory", name, "memory.limit_in_bytes"), []byte(limit), 0o644); err != nil {
			t.Fatal(err)
		}
		return filepath.Join("/sys/fs/cgroup/memory", name), procs
	}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.subtree_control"); err != nil {
		skip("no cgroup v1 memory hierarchy nor cgroup v2 at /sys/fs/cgroup")
	}
	d := filepath.Join("/sys/fs/cgroup", name)
	mk(d)
	if err := os.WriteFile(filepath.Join(d, "memory.max"), []byte(limit), 0o644); err != nil {
		t.Fatal(err)
	}
	return d, []string{filepath.Join(d, "cgroup.procs")}
}

// testCgroupPrefix names the cgroups oomCgroup makes, followed by the PID
// of the test process that made them.
const testCgroupPrefix = "amf-test-sidecar-"

// sweepTestCgroups removes the cgroups of earlier test processes that were
// killed before their cleanup ran (SIGKILL, or SIGQUIT for a goroutine
// dump, skips t.Cleanup): those whose creating process is gone. A cgroup
// of a test process still running, another copy's, is left alone.
func sweepTestCgroups(t *testing.T) {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", testCgroupPrefix+"*"))
	v1, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", testCgroupPrefix+"*"))
	for _, d := range append(dirs, v1...) {
		pid, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(d), testCgroupPrefix), "-")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil || n <= 0 || !errors.Is(syscall.Kill(n, 0), syscall.ESRCH) {
			continue // not ours to judge, or its process still runs
		}
		if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
			t.Logf("cgroup %s of a test process gone: not removed: %v", d, err)
		}
	}
}

// TestOOMKillIsSignalledWithoutWaitingForASample: a broker stand-in in a
// real cgroup allocates past its limit; the sidecar, sampling only every
// 5 s, signals unhealthy with the OOM kill as the reason (the pushed
// notification: a sample would say the target is gone) before its next
// sample.
func TestOOMKillIsSignalledWithoutWaitingForASample(t *testing.T) {
	dir, procs := oomCgroup(t)
	hog := selfCommand()
	hog.Env = append(os.Environ(), hogEnv+"=1")
	hog.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := hog.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := hog.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = hog.Wait(); close(exited) }()
	t.Cleanup(func() { _ = hog.Process.Kill(); <-exited })
	for _, p := range procs {
		if err := os.WriteFile(p, []byte(strconv.Itoa(hog.Process.Pid)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	src, err := cgroup.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Embedded(model.PaperName)
	if err != nil {
		t.Fatal(err)
	}
	rec := NewRecorder()
	const interval = 5 * time.Second // p1's longest: the push must beat it
	sc, err := New(Config{Source: src, Model: m, Interval: interval, Publisher: rec, Log: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	done := make(chan error, 1)
	go func() { done <- sc.Run(ctx) }()
	t.Cleanup(func() { <-done })
	// Healthy first (the first sample), then the allocation starts.
	waitMessage(t, rec, 30*time.Second, func(m podsignal.Message) bool { return m.State == podsignal.Healthy })
	started := time.Now()
	if _, err := io.WriteString(in, "go\n"); err != nil {
		t.Fatal(err)
	}
	msg := waitMessage(t, rec, 30*time.Second, func(m podsignal.Message) bool { return m.State == podsignal.Unhealthy })
	t.Logf("unhealthy %v after the allocation began: %s", time.Since(started), msg.Reason)
	if !strings.Contains(msg.Reason, "OOM kill") {
		t.Errorf("reason %q, want the OOM kill (pushed, not a sample's)", msg.Reason)
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the hog still runs after the OOM signal")
	}
}

// waitMessage returns the first recorded message (from the start) that
// satisfies ok, waiting up to bound.
func waitMessage(t *testing.T, rec *Recorder, bound time.Duration, ok func(podsignal.Message) bool) podsignal.Message {
	t.Helper()
	deadline := time.After(bound)
	seen := 0
	for {
		msgs, next := rec.Messages()
		for _, m := range msgs[seen:] {
			if ok(m) {
				return m
			}
		}
		seen = len(msgs)
		select {
		case <-next:
		case <-deadline:
			t.Fatalf("no such message within %v; got %+v", bound, msgs)
		}
	}
}
