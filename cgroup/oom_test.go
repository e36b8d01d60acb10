package cgroup

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// awaitEvent returns the next event, or fails after childTimeout; ok is
// false when the channel was closed.
func awaitEvent(t *testing.T, events <-chan OOMEvent) (OOMEvent, bool) {
	t.Helper()
	select {
	case ev, ok := <-events:
		return ev, ok
	case <-time.After(childTimeout):
		t.Fatalf("no OOM event and no close within %v", childTimeout)
	}
	return OOMEvent{}, false
}

// A process that allocates past its cgroup's memory limit is OOM-killed by
// the kernel, and the watch says so once, with the kill counted.
func TestWatchOOMSeesARealOOMKill(t *testing.T) {
	c := newRealCgroup(t)
	c.limit(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	events, err := WatchOOM(ctx, c.dirs[ctrlMemory])
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	hog := startChild(t, c, roleHog)
	ev, ok := awaitEvent(t, events)
	if !ok {
		t.Fatal("the channel closed before the OOM kill")
	}
	if ev.Kills != 1 || ev.Time.Before(before) {
		t.Errorf("event %+v, want 1 kill after %v", ev, before)
	}
	select {
	case <-hog.done:
	case <-time.After(childTimeout):
		t.Fatal("the hog still runs after the OOM event")
	}
	if ws, ok := hog.state.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("the hog ended %v, want killed by SIGKILL (the OOM killer)", hog.state)
	}
	// The memory readers go on reading the cgroup after the kill.
	r := mustOpen(t, c.dirs[ctrlMemory])
	if s := mustRead(t, r); s.MemoryLimitBytes != float64(cgroupLimit) {
		t.Errorf("limit after the OOM kill %v, want %d", s.MemoryLimitBytes, cgroupLimit)
	}
	cancel()
	if ev, ok := awaitEvent(t, events); ok {
		t.Errorf("event %+v after the context ended, want the channel closed", ev)
	}
}

// TestOOMKillsTellsAnOOMKilledExitWithoutAWatch: the counter read after a
// child's exit says whether the OOM killer ended it, with no watch set up
// (as node mode on a read-only cgroup v1 mount, which refuses one).
func TestOOMKillsTellsAnOOMKilledExitWithoutAWatch(t *testing.T) {
	c := newRealCgroup(t)
	c.limit(t)
	before, err := OOMKills(c.dirs[ctrlMemory])
	if err != nil {
		t.Fatal(err)
	}
	hog := startChild(t, c, roleHog)
	select {
	case <-hog.done:
	case <-time.After(childTimeout):
		t.Fatal("the hog still runs")
	}
	after, err := OOMKills(c.dirs[ctrlMemory])
	if err != nil {
		t.Fatal(err)
	}
	if before != 0 || after != 1 {
		t.Errorf("oom_kill %d before and %d after the hog's exit, want 0 and 1", before, after)
	}
	if _, err := OOMKills(t.TempDir()); err == nil {
		t.Error("a directory without a memory cgroup's files was read")
	}
}

// The channel closes when the context ends, or (v1 only: v2 does not signal
// a removal) when the cgroup is removed.
func TestWatchOOMEndsOnRealCgroup(t *testing.T) {
	tests := []struct {
		name string
		end  func(t *testing.T, c *realCgroup, cancel func()) bool // false: does not apply here
	}{
		{name: "the context ends", end: func(_ *testing.T, _ *realCgroup, cancel func()) bool { cancel(); return true }},
		{name: "the cgroup is removed (v1)", end: func(t *testing.T, c *realCgroup, _ func()) bool {
			if c.v2 {
				return false
			}
			if err := c.remove(); err != nil {
				t.Fatal(err)
			}
			return true
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newRealCgroup(t)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			events, err := WatchOOM(ctx, c.dirs[ctrlMemory])
			if err != nil {
				t.Fatal(err)
			}
			if !tc.end(t, c, cancel) {
				t.Skip("cgroup v2 does not signal a removal: the caller ends the context")
			}
			if ev, ok := awaitEvent(t, events); ok {
				t.Errorf("event %+v, want the channel closed", ev)
			}
		})
	}
}

// The v2 watch on a recorded memory.events, rewritten in place as the
// kernel updates it: an "oom" without a kill is no event; a kill is one,
// counted. (Each write replaces single digits at offset 0 in one write, so
// that the watch never reads a half-written file.)
func TestWatchOOMRecordedV2(t *testing.T) {
	dir := t.TempDir()
	events := filepath.Join(dir, "memory.events")
	f, err := os.Create(events)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	write := func(oom, kills int) {
		t.Helper()
		content := fmt.Sprintf("low 0\nhigh 0\nmax 3\noom %d\noom_kill %d\noom_group_kill 0\n", oom, kills)
		if _, err := f.WriteAt([]byte(content), 0); err != nil {
			t.Fatal(err)
		}
	}
	write(1, 1) // before the watch: not reported
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ch, err := WatchOOM(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	write(2, 1)
	write(3, 3)
	ev, ok := awaitEvent(t, ch)
	if !ok || ev.Kills != 3 {
		t.Fatalf("first event %+v (open %v), want 3 kills", ev, ok)
	}
	cancel()
	if ev, ok := awaitEvent(t, ch); ok {
		t.Errorf("event %+v after the context ended", ev)
	}
}

// A container's cgroup removed before the watch read its kill (cgroup v2's
// memory.oom.group ends the whole container, and the runtime removes its
// cgroup at once): the kill is read from the parent's (the pod's)
// hierarchical counter, once; a later kill the parent counts is another
// container's.
func TestOOMV2ReadsTheParentOnceTheContainerIsGone(t *testing.T) {
	pod := t.TempDir()
	ctr := filepath.Join(pod, "cri-containerd-1.scope")
	if err := os.Mkdir(ctr, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(dir string, kills int) {
		t.Helper()
		content := fmt.Sprintf("low 0\nhigh 0\nmax 3\noom %d\noom_kill %d\noom_group_kill 0\n", kills, kills)
		if err := os.WriteFile(filepath.Join(dir, "memory.events"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(pod, 1) // an earlier container's kill
	write(ctr, 0)
	w, err := watchV2(ctr)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	var f fileReader
	for _, step := range []struct {
		name       string
		do         func()
		last, want uint64
		wantErr    bool
	}{
		{"a kill the container's cgroup still shows", func() { write(ctr, 1); write(pod, 2) }, 0, 1, false},
		{"a kill counted, then the cgroup gone", func() { write(pod, 3); os.RemoveAll(ctr) }, 1, 2, false},
		{"the parent's next kill is another container's", func() { write(pod, 4) }, 2, 0, true},
	} {
		step.do()
		n, err := w.killsAfterSignal(t.Context(), &f, step.last)
		if (err != nil) != step.wantErr || n != step.want {
			t.Errorf("%s: %d kills, error %v; want %d, error %v", step.name, n, err, step.want, step.wantErr)
		}
	}
}

func TestWatchOOMErrorsSayWhatToPass(t *testing.T) {
	tests := []struct {
		name     string
		files    map[string]string
		contains []string
	}{
		{name: "not a memory cgroup", files: map[string]string{"cpu.stat": "usage_usec 1\n"},
			contains: []string{"neither memory.events (cgroup v2) nor memory.oom_control (cgroup v1)", "memory controller"}},
		{name: "malformed memory.events names file and line", files: map[string]string{"memory.events": "oom_kill x\n"},
			contains: []string{"memory.events", "line 1"}},
		{name: "memory.events without oom_kill", files: map[string]string{"memory.events": "oom 0\n"},
			contains: []string{"no oom_kill line"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeTree(t, tc.files)
			_, err := WatchOOM(t.Context(), dir)
			if err == nil {
				t.Fatal("no error")
			}
			for _, s := range append(tc.contains, dir) {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not contain %q", err, s)
				}
			}
		})
	}
}
