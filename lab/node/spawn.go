package node

import (
	"errors"
	"fmt"
	"os/exec"
	"runtime"
	"syscall"
	"unsafe"
)

// spawn starts cmd with its process in cgroup p of every hierarchy from its
// first instruction.
//
// cgroup v1 lets one thread change cgroups on its own (the tasks file), and a
// forked child starts in the cgroups of the thread that forked it. So a
// goroutine locks itself to an OS thread, moves the thread into p, forks and
// execs the child (os/exec forks on the calling thread), and moves the thread
// back. The thread then stays locked, blocked in waitid(WNOWAIT) on the child
// (which leaves the reaping to cmd.Wait), until the child has exited: a
// child's parent-death signal fires when the thread that forked it exits, so
// cmd.SysProcAttr.Pdeathsig then means "when the node's process dies". If the
// thread cannot be moved back, the goroutine ends locked, which makes the Go
// runtime discard the thread (and its child, through Pdeathsig).
//
// While the thread is in p, the node's PID shows in p's cgroup.procs; killAll
// skips it.
func (cg *cgroupFS) spawn(cmd *exec.Cmd, p string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		tid := syscall.Gettid()
		home, err := cg.threadCgroups(tid)
		if err != nil {
			errc <- fmt.Errorf("spawn: %w", err)
			return // locked: the thread is discarded
		}
		if err := cg.moveThread(tid, p, nil); err != nil {
			if back := cg.moveThread(tid, "", home); back != nil {
				errc <- errors.Join(err, back)
				return
			}
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		startErr := cmd.Start()
		if back := cg.moveThread(tid, "", home); back != nil {
			if startErr == nil {
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
				_ = cmd.Process.Kill()
			}
			errc <- fmt.Errorf("spawn: %w", back)
			return // locked: discarded
		}
		errc <- startErr
		if startErr == nil && cmd.SysProcAttr != nil && cmd.SysProcAttr.Pdeathsig != 0 {
			waitExitNoReap(cmd.Process.Pid)
		}
		runtime.UnlockOSThread()
	}()
	return <-errc
}

// waitExitNoReap blocks until process pid has exited, without reaping it.
func waitExitNoReap(pid int) {
	const (
		pPID    = 1
		wExited = 0x4
		wNoWait = 0x1000000
	)
	var info [128]byte // siginfo_t
	for {
		_, _, e := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid), uintptr(unsafe.Pointer(&info[0])), wExited|wNoWait, 0, 0)
		if e != syscall.EINTR {
			return // exited, or already reaped (ECHILD)
		}
	}
}
