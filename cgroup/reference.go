package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"path/filepath"
	"strings"
)

// What memory_percent is relative to when the target has no memory limit.
//
// The feature is the paper's usage / limit: how close the container is to
// the limit at which the kernel OOM-kills it, which is what the model's
// memory alarms were trained to see coming. A container without a limit of
// its own is killed when the nearest limited cgroup above it fills: the pod's
// (the kubelet sets one when every container has a limit, or from pod-level
// resources), else the kubelet's kubepods cgroup, whose limit is the node's
// allocatable memory; outside Kubernetes, or with no limit anywhere, the
// machine's memory. That limit is the honest reference. The testbed's 100 MiB,
// used before, measures nothing of such a container: a 60 MiB broker would
// look 60 % full and the agent would switch over for nothing, and its standby
// alike. Caveat, said in Why: an ancestor's limit is shared with the other
// containers under it, so the percentage understates the pressure when they
// use memory too.

// Reference sources, also the values of the sidecar's source label.
const (
	// RefContainerLimit: the target's own memory limit (the model's definition).
	RefContainerLimit = "container_limit"
	// RefParentLimit: the limit of the nearest limited cgroup above the target.
	RefParentLimit = "parent_limit"
	// RefMachineMemory: MemTotal of /proc/meminfo, no limit anywhere above.
	RefMachineMemory = "machine_memory"
)

// MemoryReference is the memory that bounds a target, with where it comes
// from.
type MemoryReference struct {
	Bytes  float64
	Source string // RefContainerLimit, RefParentLimit or RefMachineMemory
	Why    string // the file or cgroup it comes from, for logs and /status
}

// MemoryReference returns what bounds the target's memory when it has no
// limit of its own (Stats.MemoryLimitBytes 0): the limit of the nearest
// ancestor cgroup that has one (RefParentLimit), else the machine's memory
// (RefMachineMemory). A target with a limit gets RefContainerLimit.
func (r *reader) MemoryReference() (MemoryReference, error) {
	if r.mem != srcProc && r.memMount != "" {
		dir := filepath.Dir(r.memFile)
		for first := true; ; first = false {
			limit, err := r.limitOf(dir)
			if err != nil {
				return MemoryReference{}, err
			}
			hp := r.hierarchyPath(dir)
			if limit > 0 && first {
				return MemoryReference{Bytes: float64(limit), Source: RefContainerLimit,
					Why: "the container's memory limit (" + hp + ")"}, nil
			}
			if limit > 0 {
				return MemoryReference{Bytes: float64(limit), Source: RefParentLimit,
					Why: "no memory limit on the container: the limit of " + hp + describeAncestor(hp) + ", shared with the other cgroups under it"}, nil
			}
			if dir == r.memMount || !strings.HasPrefix(dir, r.memMount+string(filepath.Separator)) {
				break
			}
			dir = filepath.Dir(dir)
		}
	}
	p := filepath.Join(r.procRoot, "meminfo")
	var f fileReader
	b, err := f.read(p)
	if err != nil {
		return MemoryReference{}, err
	}
	total, err := parseMemTotal(b)
	if err != nil {
		return MemoryReference{}, inFile(p, err)
	}
	return MemoryReference{Bytes: float64(total), Source: RefMachineMemory,
		Why: "no memory limit on the container nor any cgroup above it: the machine's memory (MemTotal in " + p + ")"}, nil
}

// limitOf reads the memory limit of cgroup directory dir, 0 for none. The
// hierarchy's top has no limit file on v2 and is unlimited on v1.
func (r *reader) limitOf(dir string) (uint64, error) {
	name, parse := "memory.limit_in_bytes", parseV1Limit
	if r.mem == srcV2 {
		name, parse = "memory.max", parseMemoryMax
	}
	p := filepath.Join(dir, name)
	var f fileReader
	b, err := f.read(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, nil // no limit file there (the top of a v2 hierarchy): no limit
		}
		return 0, fmt.Errorf("memory reference: %w", err)
	}
	v, err := parse(b)
	if err != nil {
		return 0, inFile(p, err)
	}
	return v, nil
}

func (r *reader) hierarchyPath(dir string) string {
	rel, err := filepath.Rel(r.memMount, dir)
	if err != nil {
		return dir
	}
	return path.Clean("/" + filepath.ToSlash(rel))
}

// describeAncestor says what a kubelet cgroup is, from its name.
func describeAncestor(hp string) string {
	name := path.Base(hp)
	switch {
	case isKubepods(name):
		return " (the kubelet's kubepods cgroup: the node's allocatable memory)"
	case strings.HasPrefix(name, "pod") || strings.Contains(name, "-pod"):
		return " (the pod's)"
	case name == "burstable" || name == "besteffort" || strings.HasSuffix(name, "-burstable.slice") || strings.HasSuffix(name, "-besteffort.slice"):
		return " (the pod's QoS class)"
	}
	return ""
}
