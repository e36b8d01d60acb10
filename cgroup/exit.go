package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// WatchExit delivers, once, the time process pid ends, on a channel that is
// then closed; the channel is closed without a value when ctx ends first. It
// needs no parentage: a pidfd (Linux ≥ 5.3) becomes readable the moment the
// process exits, zombie or not, so an agent that sees the broker's PID (the
// host's PID namespace) learns of a crash without waiting for its next
// sample, and a PID reused later cannot be mistaken for it.
//
// The process must be running when WatchExit is called: a PID that is gone
// is an error (unix.ESRCH wrapped), not an exit, since whatever held that
// PID is not known to be the process meant.
func WatchExit(ctx context.Context, pid int) (<-chan time.Time, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("watch the exit of PID %d: not a process ID", pid)
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("watch the exit of PID %d: pidfd_open: %w", pid, err)
	}
	// Non-blocking, so the runtime's poller waits for readability and Close
	// ends a pending wait.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("watch the exit of PID %d: %w", pid, err)
	}
	f := os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", pid))
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("watch the exit of PID %d: %w", pid, err)
	}
	ch := make(chan time.Time, 1)
	stop := context.AfterFunc(ctx, func() { f.Close() })
	go func() {
		defer close(ch)
		defer stop()
		defer f.Close()
		err := rc.Read(func(fd uintptr) bool {
			// Called at once and after each readiness event: done when a
			// zero-timeout poll finds the process ended.
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(fds, 0)
			return err == nil && n > 0 || err != nil && !errors.Is(err, unix.EINTR)
		})
		if err != nil || ctx.Err() != nil {
			return // closed: ctx ended
		}
		ch <- time.Now()
	}()
	return ch, nil
}
