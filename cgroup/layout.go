package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// The v1 controllers this package reads.
const (
	ctrlCPUAcct = "cpuacct"
	ctrlMemory  = "memory"
	ctrlBlkio   = "blkio"
)

var v1Controllers = [...]string{ctrlCPUAcct, ctrlMemory, ctrlBlkio}

// hierarchy is one mounted cgroup hierarchy.
type hierarchy struct {
	mountPoint string // directory where it is mounted
	root       string // hierarchy path shown at mountPoint: "/" unless bind-mounted from inside or seen from a cgroup namespace
	v2         bool
}

// dir maps a path inside the hierarchy (as in /proc/<pid>/cgroup) to a
// directory. A path that climbs above its root ("/../<id>") is refused: the
// kernel shows a cgroup outside the reader's cgroup namespace that way,
// relative to the namespace's root, and cleaning the ".." away would name
// another cgroup (the namespace's own one for "/..").
func (h hierarchy) dir(p string) (string, error) {
	if rel := path.Clean(strings.TrimLeft(p, "/")); rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("cgroup %s is outside this process's cgroup namespace (/proc/<pid>/cgroup shows such cgroups relative to the namespace's root, and what is above it is not visible): from inside a container, find the target by pod (mount the host's /sys/fs/cgroup, pass it with WithCgroupRoot, and select the target with a PodQuery), or run outside the container's cgroup namespace", p)
	}
	p = path.Clean("/" + p)
	if h.root == "/" {
		return filepath.Join(h.mountPoint, filepath.FromSlash(p)), nil
	}
	if p == h.root {
		return h.mountPoint, nil
	}
	if rel, ok := strings.CutPrefix(p, h.root+"/"); ok {
		return filepath.Join(h.mountPoint, filepath.FromSlash(rel)), nil
	}
	return "", fmt.Errorf("cgroup %s is outside the part of the hierarchy mounted at %s (which shows %s); mount the host's cgroup filesystem and pass it with WithCgroupRoot", p, h.mountPoint, h.root)
}

// path maps a directory under the mount point back to the hierarchy path;
// ok is false when dir is not under this mount.
func (h hierarchy) path(dir string) (string, bool) {
	rel, err := filepath.Rel(h.mountPoint, dir)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", false
	}
	return path.Join(h.root, filepath.ToSlash(rel)), true
}

// layout is where the hierarchies this package needs are mounted.
type layout struct {
	v1     map[string]hierarchy // by controller, for cpuacct, memory, blkio
	v2     *hierarchy
	source string // where the layout came from, for error messages
}

// useV1 reports whether reads go to v1 controllers. On a hybrid host (v1
// controllers plus a unified mount without controllers, as systemd sets up)
// the data is in v1.
func (l layout) useV1() bool { return len(l.v1) > 0 }

// base is the hierarchy used to look up directories (pods, containers): the
// memory controller's on v1, as every container has a memory cgroup.
func (l layout) base() (hierarchy, error) {
	if l.useV1() {
		if h, ok := l.v1[ctrlMemory]; ok {
			return h, nil
		}
		if h, ok := l.v1[ctrlCPUAcct]; ok {
			return h, nil
		}
	}
	if l.v2 != nil {
		return *l.v2, nil
	}
	return hierarchy{}, fmt.Errorf("no cgroup filesystem found in %s", l.source)
}

// owner returns the hierarchy whose mount contains dir.
func (l layout) owner(dir string) (hierarchy, bool) {
	for _, c := range v1Controllers {
		if h, ok := l.v1[c]; ok {
			if _, in := h.path(dir); in {
				return h, true
			}
		}
	}
	if l.v2 != nil {
		if _, in := l.v2.path(dir); in {
			return *l.v2, true
		}
	}
	return hierarchy{}, false
}

// loadLayout finds the cgroup mounts: by probing cfg.cgroupRoot when set,
// else from <procRoot>/self/mountinfo.
func loadLayout(cfg config) (layout, error) {
	if cfg.cgroupRoot != "" {
		return probeLayout(cfg.cgroupRoot)
	}
	p := filepath.Join(cfg.procRoot, "self", "mountinfo")
	b, err := os.ReadFile(p)
	if err != nil {
		return layout{}, fmt.Errorf("find cgroup mounts: %w", err)
	}
	ms, err := parseMountInfo(b)
	if err != nil {
		return layout{}, fmt.Errorf("find cgroup mounts: %w", inFile(p, err))
	}
	l := layoutFromMounts(ms, DefaultCgroupRoot)
	l.source = p
	if !l.useV1() && l.v2 == nil {
		return layout{}, fmt.Errorf("no cgroup or cgroup2 mount in %s: mount the cgroup filesystem, or pass its location with WithCgroupRoot", p)
	}
	return l, nil
}

// layoutFromMounts picks the cgroup hierarchies from mountinfo entries,
// preferring mounts at or under prefer (a container may also have the host's
// hierarchy mounted elsewhere). A combined "cpu,cpuacct" mount serves
// cpuacct because its super options list both controllers.
func layoutFromMounts(ms []mountInfo, prefer string) layout {
	var cg []mountInfo
	for _, m := range ms {
		if m.FSType == "cgroup" || m.FSType == "cgroup2" {
			cg = append(cg, m)
		}
	}
	under := func(m mountInfo) bool {
		return m.MountPoint == prefer || strings.HasPrefix(m.MountPoint, prefer+"/")
	}
	slices.SortStableFunc(cg, func(a, b mountInfo) int {
		ua, ub := under(a), under(b)
		switch {
		case ua && !ub:
			return -1
		case ub && !ua:
			return 1
		}
		return 0
	})
	l := layout{v1: map[string]hierarchy{}}
	for _, m := range cg {
		h := hierarchy{mountPoint: m.MountPoint, root: m.Root, v2: m.FSType == "cgroup2"}
		if h.v2 {
			if l.v2 == nil {
				l.v2 = &h
			}
			continue
		}
		for _, c := range v1Controllers {
			if _, seen := l.v1[c]; !seen && slices.Contains(m.SuperOptions, c) {
				l.v1[c] = h
			}
		}
	}
	return l
}

// probeLayout reads the layout from the directory that stands for
// /sys/fs/cgroup: a v2 hierarchy has cgroup.controllers at its top; a v1 host
// has one directory per hierarchy named after its controllers ("memory",
// "cpu,cpuacct", "blkio"), possibly with symlinks such as "cpuacct".
func probeLayout(root string) (layout, error) {
	// Absolute, so that directories given relative to the working directory
	// can be matched against the mount points.
	if abs, err := filepath.Abs(root); err == nil {
		root = abs
	}
	l := layout{v1: map[string]hierarchy{}, source: root}
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		l.v2 = &hierarchy{mountPoint: root, root: "/", v2: true}
		return l, nil
	}
	ents, err := os.ReadDir(root)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return layout{}, fmt.Errorf("cgroup root %s does not exist: mount the host /sys/fs/cgroup there read-only (hostPath volume): %w", root, err)
		}
		return layout{}, fmt.Errorf("probe cgroup root: %w", err)
	}
	for _, e := range ents {
		dir := filepath.Join(root, e.Name())
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, "cgroup.controllers")); err == nil {
			if l.v2 == nil {
				l.v2 = &hierarchy{mountPoint: dir, root: "/", v2: true}
			}
			continue
		}
		for _, c := range strings.Split(e.Name(), ",") {
			if slices.Contains(v1Controllers[:], c) {
				if _, seen := l.v1[c]; !seen {
					l.v1[c] = hierarchy{mountPoint: dir, root: "/"}
				}
			}
		}
	}
	if !l.useV1() && l.v2 == nil {
		return layout{}, fmt.Errorf("no cgroup hierarchy under %s: want cgroup.controllers (v2) or controller directories such as memory/ (v1); mount the host /sys/fs/cgroup there read-only", root)
	}
	return l, nil
}
