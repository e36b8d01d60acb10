package cgroup

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Watched is what a Reader of a cgroup (Open, OpenPod) offers beyond Read,
// for push notifications of its end: where WatchOOM watches, and which
// processes WatchExit can watch. Every Reader this package returns
// implements it; one of a process in a root cgroup (ForPID, its memory read
// from the process) has no memory cgroup: MemoryDir is "".
type Watched interface {
	// MemoryDir is the directory of the target's memory cgroup (v1: under
	// the memory hierarchy; v2: the cgroup's own directory), "" without one.
	MemoryDir() string
	// PIDs lists the processes in the target's cgroup that this process's
	// PID namespace can see (cgroup.procs), in the kernel's order; none once
	// the container has ended, or when the target's processes are in another
	// PID namespace (v1 leaves them out, v2 shows them as 0: skipped).
	PIDs() ([]int, error)
}

// MemoryDir implements Watched.
func (r *reader) MemoryDir() string {
	if r.mem == srcProc {
		return ""
	}
	return filepath.Dir(r.memFile)
}

// PIDs implements Watched.
func (r *reader) PIDs() ([]int, error) {
	dir := r.MemoryDir()
	if dir == "" {
		return nil, fmt.Errorf("the target is a process (%s), not a cgroup", r.desc)
	}
	return readPIDs(filepath.Join(dir, "cgroup.procs"))
}

// ContainerPIDs lists the processes of container c (from FindContainer)
// that this process can see, as Watched.PIDs does, before a Reader is
// opened: the first is what a caller passes to WithPID for the pod's network
// counters, and to WatchExit.
func ContainerPIDs(c Container, opts ...Option) ([]int, error) {
	cfg := newConfig(opts)
	l, err := loadLayout(cfg)
	if err != nil {
		return nil, fmt.Errorf("processes of %s: %w", c, err)
	}
	base, err := l.base()
	if err != nil {
		return nil, fmt.Errorf("processes of %s: %w", c, err)
	}
	dir, err := base.dir(c.Path)
	if err != nil {
		return nil, fmt.Errorf("processes of %s: %w", c, err)
	}
	return readPIDs(filepath.Join(dir, "cgroup.procs"))
}

func readPIDs(p string) ([]int, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, readError(p, err)
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, inFile(p, fmt.Errorf("%q is not a PID", f))
		}
		if n > 0 {
			pids = append(pids, n)
		}
	}
	return pids, nil
}
