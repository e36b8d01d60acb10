package cgroup

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
