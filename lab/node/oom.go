package node

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// oomWatch is a cgroup v1 OOM notification: an eventfd registered through
// cgroup.event_control on memory.oom_control of one memory cgroup. The kernel
// signals it when the cgroup (or an ancestor) is under OOM, and when the
// cgroup is removed.
type oomWatch struct {
	dir     string   // the memory cgroup's directory
	event   *os.File // the eventfd, non-blocking, so reads park the goroutine only
	control *os.File // memory.oom_control, open as long as the registration lives
}

// watchOOM registers an OOM notification on memory cgroup p. Register it
// before the cgroup has processes, so no OOM is missed.
func (cg *cgroupFS) watchOOM(p string) (*oomWatch, error) {
	dir := cg.memory.dir(p)
	control, err := os.Open(filepath.Join(dir, "memory.oom_control"))
	if err != nil {
		return nil, fmt.Errorf("oom watch: %w", err)
	}
	efd, _, errno := syscall.RawSyscall(syscall.SYS_EVENTFD2, 0, syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if errno != 0 {
		control.Close()
		return nil, fmt.Errorf("oom watch: eventfd: %w", errno)
	}
	event := os.NewFile(efd, "eventfd:"+p)
	reg := fmt.Sprintf("%d %d", efd, control.Fd())
	if err := os.WriteFile(filepath.Join(dir, "cgroup.event_control"), []byte(reg), 0o644); err != nil {
		event.Close()
		control.Close()
		return nil, fmt.Errorf("oom watch: register on %s: %w", dir, err)
	}
	return &oomWatch{dir: dir, event: event, control: control}, nil
}

// wait blocks until the next notification; it fails once close was called.
func (w *oomWatch) wait() error {
	var b [8]byte
	_, err := w.event.Read(b[:])
	return err
}

// kills is the cgroup's oom_kill counter: how many processes the kernel has
// OOM-killed in it. The notification alone does not mean a kill (an OOM can
// resolve when a task exits), so this confirms it.
func (w *oomWatch) kills() (uint64, error) {
	b, err := os.ReadFile(filepath.Join(w.dir, "memory.oom_control"))
	if err != nil {
		return 0, err
	}
	return parseOOMKills(b)
}

func parseOOMKills(b []byte) (uint64, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "oom_kill "); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("memory.oom_control: no oom_kill line (kernel older than 4.13?)")
}

// close ends the registration; a pending wait returns an error.
func (w *oomWatch) close() {
	w.event.Close()
	w.control.Close()
}
