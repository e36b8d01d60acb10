package cgroup

import (
	"slices"
	"testing"
)

// A reader of a real cgroup says where its memory cgroup is (WatchOOM's
// directory) and lists the processes in it, as ContainerPIDs does before a
// reader is opened; once the process is gone the list is empty.
func TestWatchedListsTheProcessesOfARealCgroup(t *testing.T) {
	c := newRealCgroup(t)
	ch := startChild(t, c, rolePause)
	r := mustOpen(t, c.dirs[ctrlMemory])
	w, ok := r.(Watched)
	if !ok {
		t.Fatalf("%T does not implement Watched", r)
	}
	if got := w.MemoryDir(); got != c.dirs[ctrlMemory] {
		t.Errorf("MemoryDir %s, want %s", got, c.dirs[ctrlMemory])
	}
	pids, err := w.PIDs()
	if err != nil || !slices.Equal(pids, []int{ch.pid}) {
		t.Errorf("PIDs %v, %v; want [%d]", pids, err, ch.pid)
	}
	byContainer, err := ContainerPIDs(Container{Path: c.path})
	if err != nil || !slices.Equal(byContainer, []int{ch.pid}) {
		t.Errorf("ContainerPIDs %v, %v; want [%d]", byContainer, err, ch.pid)
	}
	ch.stop()
	if pids, err := w.PIDs(); err != nil || len(pids) != 0 {
		t.Errorf("PIDs after the process ended %v, %v; want none", pids, err)
	}
}
