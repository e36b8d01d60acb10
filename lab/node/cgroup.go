package node

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// hierarchy is one mounted cgroup v1 hierarchy.
type hierarchy struct {
	mount       string   // where it is mounted, e.g. /sys/fs/cgroup/memory
	controllers []string // e.g. [cpu cpuacct] when co-mounted, sorted
}

func (h hierarchy) has(c string) bool { return slices.Contains(h.controllers, c) }

// dir is the directory of the cgroup at hierarchy path p.
func (h hierarchy) dir(p string) string {
	return filepath.Join(h.mount, filepath.FromSlash(path.Clean("/"+p)))
}

// cgroupFS is the machine's cgroup v1 hierarchies under a root.
type cgroupFS struct {
	hs     []hierarchy // sorted by mount point
	memory hierarchy
	log    *slog.Logger
}

// discoverCgroups finds the cgroup v1 hierarchies mounted under root (from
// /proc/self/mountinfo), skipping named hierarchies without controllers (such
// as name=systemd), cgroup2 mounts and hierarchies mounted from a sub-tree. It
// needs at least the memory controller.
func discoverCgroups(root string, log *slog.Logger) (*cgroupFS, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cgroups: %w", err)
	}
	hs, skipped, err := parseMountInfo(b, root)
	if err != nil {
		return nil, fmt.Errorf("cgroups: /proc/self/mountinfo: %w", err)
	}
	if len(skipped) > 0 {
		log.Debug("cgroup mounts skipped", "mounts", skipped)
	}
	cg := &cgroupFS{hs: hs, log: log}
	for _, h := range hs {
		if h.has("memory") {
			cg.memory = h
		}
	}
	if cg.memory.mount == "" {
		return nil, fmt.Errorf("cgroups: no cgroup v1 memory hierarchy under %s (the lab node needs cgroup v1 controllers; cgroup v2 is not supported)", root)
	}
	return cg, nil
}

// parseMountInfo returns the usable v1 hierarchies under root, and the cgroup
// mounts it skipped with the reason.
func parseMountInfo(b []byte, root string) ([]hierarchy, []string, error) {
	root = filepath.Clean(root)
	var hs []hierarchy
	var skipped []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// 34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
		f := strings.Fields(sc.Text())
		sep := slices.Index(f, "-")
		if sep < 5 || sep+3 >= len(f) {
			continue
		}
		fstype, mroot, mnt, super := f[sep+1], f[3], unescapeMount(f[4]), f[sep+3]
		if fstype != "cgroup" && fstype != "cgroup2" {
			continue
		}
		if mnt != root && !strings.HasPrefix(mnt, root+"/") {
			continue
		}
		if fstype == "cgroup2" {
			skipped = append(skipped, mnt+" (cgroup2)")
			continue
		}
		var ctrls []string
		for _, o := range strings.Split(super, ",") {
			switch {
			case o == "rw" || o == "ro" || strings.HasPrefix(o, "name=") || strings.Contains(o, "=") ||
				o == "noprefix" || o == "clone_children" || o == "xattr" || o == "cpuset_v2_mode" || o == "favordynmods":
			default:
				ctrls = append(ctrls, o)
			}
		}
		if len(ctrls) == 0 {
			skipped = append(skipped, mnt+" (named hierarchy without controllers)")
			continue
		}
		if mroot != "/" {
			skipped = append(skipped, mnt+" (shows "+mroot+", not the hierarchy's root)")
			continue
		}
		slices.Sort(ctrls)
		if slices.ContainsFunc(hs, func(h hierarchy) bool { return slices.Equal(h.controllers, ctrls) }) {
			continue // the same hierarchy mounted twice
		}
		hs = append(hs, hierarchy{mount: mnt, controllers: ctrls})
	}
	slices.SortFunc(hs, func(a, b hierarchy) int { return strings.Compare(a.mount, b.mount) })
	return hs, skipped, sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// create makes the cgroup p (and its missing parents) in every hierarchy and
// writes l to it. cpuset cgroups get their parent's cpus and mems, since a new
// v1 cpuset is empty and refuses tasks.
func (cg *cgroupFS) create(p string, l limits) error {
	for _, h := range cg.hs {
		if err := mkdirCgroup(h, p); err != nil {
			return err
		}
	}
	return cg.set(p, l)
}

func mkdirCgroup(h hierarchy, p string) error {
	elems := strings.Split(strings.Trim(path.Clean("/"+p), "/"), "/")
	cur := "/"
	for _, e := range elems {
		parent := cur
		cur = path.Join(cur, e)
		dir := h.dir(cur)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("cgroup %s: %w", dir, err)
		}
		if h.has("cpuset") {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(dir, f))
				if err == nil && len(bytes.TrimSpace(b)) > 0 {
					continue
				}
				pb, err := os.ReadFile(filepath.Join(h.dir(parent), f))
				if err != nil {
					return fmt.Errorf("cgroup %s: %w", dir, err)
				}
				if err := os.WriteFile(filepath.Join(dir, f), pb, 0o644); err != nil {
					return fmt.Errorf("cgroup %s: %s: %w", dir, f, err)
				}
			}
		}
	}
	return nil
}

// set writes the limits of cgroup p.
func (cg *cgroupFS) set(p string, l limits) error {
	type write struct{ ctrl, file, value string }
	ws := []write{{"cpu", "cpu.shares", strconv.FormatUint(l.cpuShares, 10)}}
	if l.memory > 0 {
		ws = append(ws, write{"memory", "memory.limit_in_bytes", strconv.FormatInt(l.memory, 10)})
	}
	if l.cpuQuota > 0 {
		ws = append(ws, write{"cpu", "cpu.cfs_period_us", strconv.Itoa(cpuPeriod)},
			write{"cpu", "cpu.cfs_quota_us", strconv.FormatInt(l.cpuQuota, 10)})
	}
	for _, w := range ws {
		for _, h := range cg.hs {
			if !h.has(w.ctrl) {
				continue
			}
			f := filepath.Join(h.dir(p), w.file)
			if err := os.WriteFile(f, []byte(w.value), 0o644); err != nil {
				return fmt.Errorf("cgroup: write %s to %s: %w", w.value, f, err)
			}
		}
	}
	return nil
}

// procs lists the processes in cgroup p (memory hierarchy, where every
// process of ours is). A cgroup that is gone has none.
func (cg *cgroupFS) procs(p string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(cg.memory.dir(p), "cgroup.procs"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil && n > 0 {
			pids = append(pids, n)
		}
	}
	return pids, nil
}

// killAll SIGKILLs every process in cgroup p and its children until none is
// left, or until timeout. The node's own process is never killed: it is in a
// container's cgroups for a moment while it forks into them (see spawn).
func (cg *cgroupFS) killAll(p string, timeout time.Duration) error {
	self := os.Getpid()
	deadline := time.Now().Add(timeout)
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		var left []int
		err := filepath.WalkDir(cg.memory.dir(p), func(dir string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			if !d.IsDir() {
				return nil
			}
			rel, _ := filepath.Rel(cg.memory.mount, dir)
			pids, err := cg.procs("/" + filepath.ToSlash(rel))
			if err != nil {
				return err
			}
			for _, pid := range pids {
				if pid != self {
					left = append(left, pid)
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("cgroup %s: %w", p, err)
		}
		if len(left) == 0 {
			return nil
		}
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: processes %v still there after %v", p, left, timeout)
		}
		// A killed process leaves its cgroup when it has exited; a fork in
		// flight may have added one. Look again shortly.
		time.Sleep(delay)
	}
}

// remove kills what is left in cgroup p and removes it (children first) from
// every hierarchy. A cgroup that is already gone is fine.
// A process that joins the cgroup while it is being removed (Exec, spawn in
// flight) makes rmdir fail: kill and try again.
func (cg *cgroupFS) remove(p string) error {
	var errs []error
	for range 3 {
		errs = errs[:0]
		if err := cg.killAll(p, 10*time.Second); err != nil {
			errs = append(errs, err)
		}
		for _, h := range cg.hs {
			if err := rmdirTree(h.dir(p)); err != nil {
				errs = append(errs, err)
			}
		}
		if len(errs) == 0 {
			return nil
		}
	}
	return errors.Join(errs...)
}

// rmdirTree removes a cgroup directory and its child cgroups. rmdir of a
// cgroup whose last process has just exited can fail with EBUSY for a moment.
func rmdirTree(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := rmdirTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	deadline := time.Now().Add(2 * time.Second)
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		err := syscall.Rmdir(dir)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("cgroup: rmdir %s: %w", dir, err)
		}
		time.Sleep(delay)
	}
}

// exists reports whether cgroup p exists (memory hierarchy).
func (cg *cgroupFS) exists(p string) bool {
	_, err := os.Stat(cg.memory.dir(p))
	return err == nil
}

// threadCgroups returns the hierarchy path of thread tid in each of cg's
// hierarchies, from /proc/self/task/<tid>/cgroup.
func (cg *cgroupFS) threadCgroups(tid int) (map[string]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/cgroup", tid))
	if err != nil {
		return nil, err
	}
	byCtrls := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || parts[1] == "" {
			continue
		}
		ctrls := strings.Split(parts[1], ",")
		slices.Sort(ctrls)
		byCtrls[strings.Join(ctrls, ",")] = parts[2]
	}
	out := map[string]string{}
	for _, h := range cg.hs {
		p, ok := byCtrls[strings.Join(h.controllers, ",")]
		if !ok {
			return nil, fmt.Errorf("thread %d: no %s line in its cgroup file", tid, strings.Join(h.controllers, ","))
		}
		out[h.mount] = p
	}
	return out, nil
}

// moveThread writes tid into the tasks file of its cgroup in each hierarchy:
// to[mount] if given as a map, else p.
func (cg *cgroupFS) moveThread(tid int, p string, to map[string]string) error {
	for _, h := range cg.hs {
		dst := p
		if to != nil {
			dst = to[h.mount]
		}
		f := filepath.Join(h.dir(dst), "tasks")
		if err := os.WriteFile(f, []byte(strconv.Itoa(tid)), 0o644); err != nil {
			return fmt.Errorf("cgroup: move thread %d to %s: %w", tid, f, err)
		}
	}
	return nil
}
