package cgroup

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// OOMEvent says the kernel has OOM-killed processes in a watched memory
// cgroup since the previous event (or since the watch began).
type OOMEvent struct {
	Time time.Time // when the watch saw the kill
	// Kills is the cgroup's oom_kill counter: how many processes the kernel
	// has OOM-killed in it since it was created (on v2 in its descendants
	// too). Kills that come close together may arrive as one event; the
	// counter tells how many there were.
	Kills uint64
}

// WatchOOM watches the memory cgroup directory dir (a cgroup v2 directory,
// or one under a v1 memory hierarchy) for OOM kills, and sends an OOMEvent
// each time its oom_kill counter has grown. Kills before the call are not
// reported. Register the watch before the cgroup has processes, so that no
// kill is missed.
//
//   - cgroup v2: inotify on memory.events, which the kernel marks modified
//     when it counts an OOM or an OOM kill; oom_kill is read from it.
//   - cgroup v1: an eventfd registered with cgroup.event_control on
//     memory.oom_control, which the kernel signals when the cgroup runs out
//     of memory and when it is removed; oom_kill is read from
//     memory.oom_control (kernel ≥ 4.13). The signal comes just before the
//     kernel picks a victim, and no event follows the kill itself, so the
//     counter is read again for up to oomKillWait after a signal.
//
// The channel is closed when ctx ends, or when the cgroup turns out to be
// removed: v1 signals the removal; v2 does not, so there a removed cgroup
// is noticed only at its next event and the caller ends ctx when the
// container is gone.
func WatchOOM(ctx context.Context, dir string) (<-chan OOMEvent, error) {
	var w oomSource
	var err error
	switch {
	case exists(filepath.Join(dir, "memory.events")):
		w, err = watchV2(dir)
	case exists(filepath.Join(dir, "memory.oom_control")):
		w, err = watchV1(dir)
	default:
		return nil, fmt.Errorf("watch OOM kills in %s: neither memory.events (cgroup v2) nor memory.oom_control (cgroup v1) is there: pass a memory cgroup's directory other than the root, with the memory controller enabled", dir)
	}
	if err != nil {
		return nil, fmt.Errorf("watch OOM kills in %s: %w", dir, err)
	}
	var f fileReader
	last, err := w.kills(&f)
	if err != nil {
		w.close()
		return nil, fmt.Errorf("watch OOM kills in %s: %w", dir, err)
	}
	ch := make(chan OOMEvent)
	stop := context.AfterFunc(ctx, w.close) // ends a pending wait
	go func() {
		defer close(ch)
		defer stop()
		defer w.close()
		for {
			if err := w.wait(); err != nil || ctx.Err() != nil {
				return
			}
			n, err := w.killsAfterSignal(ctx, &f, last)
			if err != nil {
				return // removed, or unreadable: nothing more will come
			}
			if n <= last {
				continue
			}
			last = n
			select {
			case ch <- OOMEvent{Time: time.Now(), Kills: n}:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

// OOMKills reads the oom_kill counter of the memory cgroup at dir (v2:
// memory.events, v1: memory.oom_control): a plain read, which works where
// WatchOOM cannot (v1 on a read-only mount), to tell an OOM-killed process
// from one that exited otherwise once its exit is known.
func OOMKills(dir string) (uint64, error) {
	var f fileReader
	for _, name := range []string{"memory.events", "memory.oom_control"} {
		if p := filepath.Join(dir, name); exists(p) {
			return readKills(&f, p)
		}
	}
	return 0, fmt.Errorf("read OOM kills in %s: neither memory.events nor memory.oom_control is there", dir)
}

// oomKillWait bounds how long a v1 watch reads oom_kill again after a
// signal, waiting for the kill that follows it.
const oomKillWait = 100 * time.Millisecond

// oomSource is one cgroup version's notification.
type oomSource interface {
	wait() error                         // blocks until the next notification; fails once closed
	kills(f *fileReader) (uint64, error) // reads the oom_kill counter
	killsAfterSignal(ctx context.Context, f *fileReader, last uint64) (uint64, error)
	close()
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// oomV2 is an inotify watch on memory.events, the container's and its
// parent's (the pod's).
//
// The parent is watched because of memory.oom.group, which the kubelet sets
// on cgroup v2 (Kubernetes ≥ 1.32, singleProcessOOMKill false): an OOM kill
// ends every process of the container, and the runtime removes the
// container's cgroup at once — on a slow node before the watch has read the
// kill from it, or before the kernel's rate-limited second notification
// (cgroup_file_notify: one per 10 ms) is sent. The parent's memory.events
// counts its descendants' kills too and outlives the container, so a kill
// that the container's file no longer shows is read from there. A kill in
// another container of the pod at the same moment would be taken for this
// one's.
type oomV2 struct {
	events string
	parent string // the parent's memory.events; "" where it has none
	// lastParent is the parent's oom_kill when the container's cgroup was
	// last read.
	lastParent uint64
	// gone: the container's cgroup is gone and its last kills reported;
	// later kills the parent counts are another container's.
	gone bool
	ino  *os.File // non-blocking, so a read parks only its goroutine and close ends it
	once sync.Once
}

func watchV2(dir string) (*oomV2, error) {
	fd, err := syscall.InotifyInit1(syscall.IN_CLOEXEC | syscall.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	w := &oomV2{events: filepath.Join(dir, "memory.events"), ino: os.NewFile(uintptr(fd), "inotify")}
	if _, err := syscall.InotifyAddWatch(fd, w.events, syscall.IN_MODIFY); err != nil {
		w.close()
		return nil, fmt.Errorf("inotify on %s: %w", w.events, err)
	}
	// The root cgroup has no memory.events: then there is no parent to read.
	if parent := filepath.Join(filepath.Dir(dir), "memory.events"); exists(parent) {
		var f fileReader
		if n, err := readKills(&f, parent); err == nil {
			if _, err := syscall.InotifyAddWatch(fd, parent, syscall.IN_MODIFY); err == nil {
				w.parent, w.lastParent = parent, n
			}
		}
	}
	return w, nil
}

func (w *oomV2) wait() error {
	var buf [syscall.SizeofInotifyEvent + syscall.NAME_MAX + 1]byte
	_, err := w.ino.Read(buf[:])
	return err
}

func (w *oomV2) kills(f *fileReader) (uint64, error) { return readKills(f, w.events) }

// killsAfterSignal: the kernel marks memory.events modified after it has
// counted the kill, so one read is enough — of the container's file, or,
// once the container's cgroup is gone, of its parent's: the kills the
// parent counted since the container was last read are the container's.
func (w *oomV2) killsAfterSignal(_ context.Context, f *fileReader, last uint64) (uint64, error) {
	if w.gone {
		return 0, fmt.Errorf("%s: %w", w.events, os.ErrNotExist)
	}
	var parent uint64
	var perr error = os.ErrNotExist
	if w.parent != "" {
		parent, perr = readKills(f, w.parent) // first: a kill counted between the reads is then the container's
	}
	n, err := w.kills(f)
	if err == nil {
		if perr == nil {
			w.lastParent = parent
		}
		return n, nil
	}
	if perr == nil && parent > w.lastParent {
		n, w.lastParent, w.gone = last+parent-w.lastParent, parent, true
		return n, nil
	}
	return 0, err
}

func (w *oomV2) close() { w.once.Do(func() { w.ino.Close() }) }

// oomV1 is an eventfd registered on memory.oom_control.
type oomV1 struct {
	control string
	event   *os.File // the eventfd, non-blocking
	ctrl    *os.File // memory.oom_control, open as long as the registration lives
	once    sync.Once
}

func watchV1(dir string) (*oomV1, error) {
	w := &oomV1{control: filepath.Join(dir, "memory.oom_control")}
	ctrl, err := os.Open(w.control)
	if err != nil {
		return nil, err
	}
	efd, _, errno := syscall.RawSyscall(syscall.SYS_EVENTFD2, 0, syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
	if errno != 0 {
		ctrl.Close()
		return nil, fmt.Errorf("eventfd: %w", errno)
	}
	w.ctrl, w.event = ctrl, os.NewFile(efd, "eventfd")
	reg := fmt.Sprintf("%d %d", w.event.Fd(), w.ctrl.Fd())
	// Without O_CREATE: a directory that is not a cgroup (a recorded tree)
	// must not get a file.
	ec, err := os.OpenFile(filepath.Join(dir, "cgroup.event_control"), os.O_WRONLY, 0)
	if err == nil {
		_, err = ec.WriteString(reg)
		if cerr := ec.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		w.close()
		return nil, fmt.Errorf("register an OOM notification in cgroup.event_control: %w", err)
	}
	return w, nil
}

func (w *oomV1) wait() error {
	var b [8]byte
	_, err := w.event.Read(b[:])
	return err
}

func (w *oomV1) kills(f *fileReader) (uint64, error) { return readKills(f, w.control) }

// killsAfterSignal reads oom_kill until it passes last, for up to
// oomKillWait: the signal precedes the kill, which sends none of its own.
// An OOM can also end without a kill (a task exiting frees memory).
func (w *oomV1) killsAfterSignal(ctx context.Context, f *fileReader, last uint64) (uint64, error) {
	deadline := time.Now().Add(oomKillWait)
	for {
		n, err := w.kills(f)
		if err != nil || n > last || time.Now().After(deadline) {
			return n, err
		}
		select {
		case <-time.After(2 * time.Millisecond):
		case <-ctx.Done():
			return n, ctx.Err()
		}
	}
}

func (w *oomV1) close() {
	w.once.Do(func() {
		w.event.Close()
		w.ctrl.Close()
	})
}

func readKills(f *fileReader, p string) (uint64, error) {
	b, err := f.read(p)
	if err != nil {
		return 0, err
	}
	n, err := parseOOMKills(b)
	if err != nil {
		return 0, inFile(p, err)
	}
	return n, nil
}
