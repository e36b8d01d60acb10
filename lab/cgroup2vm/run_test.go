package cgroup2vm

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// lineSignal is a console that signals on the first line with a prefix.
type lineSignal struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	prefix string
	seen   chan string
	once   sync.Once
}

func (w *lineSignal) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(b)
	for _, l := range strings.Split(w.buf.String(), "\n") {
		if strings.HasPrefix(l, w.prefix) {
			w.once.Do(func() { w.seen <- l })
		}
	}
	return len(b), nil
}

// exits waits up to timeout for pid to exit (a zombie left to its new
// parent counts), by polling a pidfd, which turns readable at the exit.
func exits(pid int, timeout time.Duration) bool {
	fd, _, errno := syscall.Syscall(434 /* SYS_PIDFD_OPEN */, uintptr(pid), 0, 0)
	if errno == syscall.ESRCH {
		return true
	}
	if errno != 0 {
		return false
	}
	defer syscall.Close(int(fd))
	var set syscall.FdSet
	set.Bits[fd/64] |= 1 << (fd % 64)
	tv := syscall.NsecToTimeval(timeout.Nanoseconds())
	n, err := syscall.Select(int(fd)+1, &set, nil, nil, &tv)
	return err == nil && n == 1
}

// boot1 runs the emulator and reads its console; /bin/sh stands in for
// qemu here, printing what a guest prints.
func TestBootEndsWithTheGuestAndKillsWhatItStarted(t *testing.T) {
	sh := "/bin/sh"
	if _, err := os.Stat(sh); err != nil {
		t.Skip("needs /bin/sh to stand in for qemu")
	}
	tests := []struct {
		name    string
		script  string
		timeout time.Duration
		cancel  bool   // end the context once the script says "started"
		err     string // "" for none
		ok      bool
	}{
		{name: "the guest's power-off ends the run",
			script: `printf '\033c--- PASS: TestA (0.01s)\nAMF-GUEST-RESULT: PASS\n'`, ok: true},
		{name: "a failing emulator is an error with its stderr",
			script: `echo 'could not load kernel' >&2; exit 1`, err: "could not load kernel"},
		{name: "the timeout kills the emulator and its children",
			script: `sleep 60 & echo "started $$ $!"; wait`, timeout: 300 * time.Millisecond, err: "did not power off within"},
		{name: "an interrupt kills the emulator and its children",
			script: `sleep 60 & echo "started $$ $!"; wait`, cancel: true, err: "guest stopped"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			console := &lineSignal{prefix: "started ", seen: make(chan string, 1)}
			cfg := Config{Timeout: tc.timeout, Console: console}
			if cfg.Timeout == 0 {
				cfg.Timeout = 30 * time.Second
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			type result struct {
				s   *Summary
				err error
			}
			done := make(chan result, 1)
			go func() {
				s, err := boot1(ctx, cfg, sh, []string{"-c", tc.script})
				done <- result{s, err}
			}()
			var pids []int
			var r result
			select {
			case l := <-console.seen:
				for _, f := range strings.Fields(strings.TrimPrefix(l, "started ")) {
					n, _ := strconv.Atoi(f)
					pids = append(pids, n)
				}
				if tc.cancel {
					cancel()
				}
				r = <-done
			case r = <-done:
			}
			if tc.err == "" && r.err != nil || tc.err != "" && (r.err == nil || !strings.Contains(r.err.Error(), tc.err)) {
				t.Fatalf("boot1 = %v, want error %q", r.err, tc.err)
			}
			if r.s.OK() != tc.ok {
				t.Errorf("summary %+v OK %v, want %v", r.s, r.s.OK(), tc.ok)
			}
			if strings.Contains(console.buf.String(), "\033") {
				t.Errorf("console %q keeps the firmware's terminal escapes", console.buf.String())
			}
			for _, pid := range pids {
				if !exits(pid, 10*time.Second) {
					t.Errorf("process %d still runs", pid)
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			if tc.cancel && !errors.Is(r.err, context.Canceled) {
				t.Errorf("error %v does not wrap context.Canceled", r.err)
			}
		})
	}
}
