package cgroup

import (
	"bufio"
	"context"
	"errors"
	"io"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// startPaused starts this test binary as a child that waits until killed
// (rolePause; no other binary is needed, so it runs in make test-cgroup2's
// guest too).
func startPaused(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := selfCommand(rolePause)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if _, err := io.WriteString(in, "go\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("child said %q (%v), want ready", line, err)
	}
	return cmd
}

// The exit arrives as it happens, before anyone reaps the process (a
// zombie has ended for the watcher: its broker is not serving).
func TestWatchExitDeliversTheKillOfARunningProcess(t *testing.T) {
	cmd := startPaused(t)
	ch, err := WatchExit(t.Context(), cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-ch:
		t.Fatalf("exit delivered at %v for a process still running", at)
	case <-time.After(50 * time.Millisecond): // a running process must not be reported: nothing to await but time
	}
	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	at, ok := <-ch
	if !ok {
		t.Fatal("channel closed without the exit")
	}
	if at.Before(killed) {
		t.Errorf("exit at %v, before the kill at %v", at, killed)
	}
	if _, ok := <-ch; ok {
		t.Error("a second value after the exit; want the channel closed")
	}
}

func TestWatchExitClosesWithoutAValueWhenTheContextEnds(t *testing.T) {
	cmd := startPaused(t)
	ctx, cancel := context.WithCancel(t.Context())
	ch, err := WatchExit(ctx, cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	if at, ok := <-ch; ok {
		t.Errorf("exit at %v delivered after ctx ended, the process still running", at)
	}
}

func TestWatchExitRefusesAProcessThatIsGone(t *testing.T) {
	cmd := startPaused(t)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait() // reaped: the PID is free
	for _, pid := range []int{cmd.Process.Pid, 0, -1} {
		if _, err := WatchExit(t.Context(), pid); err == nil {
			t.Errorf("WatchExit(%d): no error for a process that is not there", pid)
		} else if pid > 0 && !errors.Is(err, unix.ESRCH) {
			t.Errorf("WatchExit(%d) = %v, want ESRCH wrapped", pid, err)
		}
	}
}
