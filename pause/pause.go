// Package pause stops and resumes the processes of one container, as this
// process sees them in its /proc: the sidecar's lever for the node agent's
// fence (DESIGN.md, "Losing a whole node"). In a pod it needs the pod's
// shared process namespace (shareProcessNamespace: true) and the broker's
// user, which inject --standby gives a hot pair's sidecar: a process may
// signal another of its own user without any capability.
//
// SIGSTOP rather than the freezer: the freezer needs a writable cgroup tree,
// which a container never gets; SIGSTOP needs nothing new, keeps every
// connection and all state, and SIGCONT undoes it. The kubelet can still
// stop a paused container: SIGKILL ends a stopped process, and a SIGTERM
// that waits (TermPending) is let through by Cont.
package pause

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Container is the processes under /proc whose cgroup's last element is
// Leaf: the name of the container's own cgroup directory (the container ID,
// cri-containerd-<id>.scope under systemd), which is the same seen from the
// host's cgroup namespace (v1: a full path) and from a container's own (v2:
// "/../<leaf>").
type Container struct {
	Proc string // the /proc to look in; "" is /proc
	Leaf string
}

// ErrNone is returned when no process of the container is visible: the pod
// does not share its process namespace, or the container is not running.
var ErrNone = errors.New("pause: no process of the container is visible here")

// maxRounds bounds Stop's scans: a process forked between a scan and its
// signals is found by the next scan, a container forking without end by none.
const maxRounds = 8

func (c Container) proc() string {
	if c.Proc == "" {
		return "/proc"
	}
	return c.Proc
}

// PIDs lists the container's processes, never this process itself.
func (c Container) PIDs() ([]int, error) {
	if c.Leaf == "" || strings.Contains(c.Leaf, "/") {
		return nil, fmt.Errorf("pause: container cgroup name %q: want the last element of its cgroup path", c.Leaf)
	}
	entries, err := os.ReadDir(c.proc())
	if err != nil {
		return nil, fmt.Errorf("pause: list processes: %w", err)
	}
	self := os.Getpid()
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join(c.proc(), e.Name(), "cgroup"))
		if err != nil {
			continue // ended meanwhile
		}
		if inLeaf(b, c.Leaf) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// inLeaf says whether a /proc/<pid>/cgroup names leaf as the last element of
// any of its paths ("hierarchy:controllers:path" lines).
func inLeaf(b []byte, leaf string) bool {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		i := strings.LastIndexByte(line, ':')
		if i >= 0 && path.Base(line[i+1:]) == leaf {
			return true
		}
	}
	return false
}

// Stop sends SIGSTOP to every process of the container, scanning again
// until a scan finds none it has not stopped, and returns how many it
// stopped. A process it may not signal is an error naming it.
func (c Container) Stop() (int, error) {
	done := map[int]bool{}
	for range maxRounds {
		pids, err := c.PIDs()
		if err != nil {
			return len(done), err
		}
		fresh := 0
		for _, pid := range pids {
			if done[pid] {
				continue
			}
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				if errors.Is(err, syscall.ESRCH) {
					continue
				}
				return len(done), fmt.Errorf("pause: stop process %d of %s: %w (the sidecar needs the broker's user and the pod's process namespace)", pid, c.Leaf, err)
			}
			done[pid] = true
			fresh++
		}
		if fresh == 0 {
			if len(done) == 0 {
				return 0, fmt.Errorf("%w (cgroup %s)", ErrNone, c.Leaf)
			}
			return len(done), nil
		}
	}
	return len(done), fmt.Errorf("pause: %s still forked new processes after %d scans", c.Leaf, maxRounds)
}

// Cont sends SIGCONT to every process of the container and returns how
// many it resumed.
func (c Container) Cont() (int, error) {
	pids, err := c.PIDs()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			if errors.Is(err, syscall.ESRCH) {
				continue
			}
			return n, fmt.Errorf("pause: resume process %d of %s: %w", pid, c.Leaf, err)
		}
		n++
	}
	return n, nil
}

// sigterm is SIGTERM's bit in /proc/<pid>/status's pending masks.
const sigterm = uint64(1) << (syscall.SIGTERM - 1)

// TermPending says whether a process of the container has a SIGTERM waiting
// (SigPnd, for the thread, or ShdPnd, for the process): something, the
// kubelet stopping the container, asked it to end while it was paused.
func (c Container) TermPending() (bool, error) {
	pids, err := c.PIDs()
	if err != nil {
		return false, err
	}
	for _, pid := range pids {
		b, err := os.ReadFile(filepath.Join(c.proc(), strconv.Itoa(pid), "status"))
		if err != nil {
			continue
		}
		if termIn(b) {
			return true, nil
		}
	}
	return false, nil
}

func termIn(status []byte) bool {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "SigPnd" && k != "ShdPnd") {
			continue
		}
		mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err == nil && mask&sigterm != 0 {
			return true
		}
	}
	return false
}

// Stopped says whether process pid is in the stopped state (T), from its
// /proc/<pid>/stat: what a paused process looks like from outside (the lab checks the fence by it).
func Stopped(proc string, pid int) (bool, error) {
	if proc == "" {
		proc = "/proc"
	}
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "stat"))
	if err != nil {
		return false, err
	}
	// The state follows the command name, which is in parentheses and may
	// itself contain ") ".
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false, fmt.Errorf("pause: %s/%d/stat: no state field", proc, pid)
	}
	return b[i+2] == 'T', nil
}
