package images

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// pauseBinary writes the image's /pause to a temp file: the tests run the
// artifact the node will run, not a test build of it.
func pauseBinary(t *testing.T) string {
	t.Helper()
	img, _ := openArchive(t, built(t).image(t, Pause).Archive)
	p := filepath.Join(t.TempDir(), "pause")
	if err := os.WriteFile(p, layerFiles(t, img)["/pause"].data, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPauseExitsZeroOnSignal(t *testing.T) {
	bin := pauseBinary(t)
	for _, tc := range []struct {
		name  string
		sig   syscall.Signal
		pidNS bool // PID 1 of its own PID namespace, as in a pod
	}{
		{"SIGTERM", syscall.SIGTERM, false},
		{"SIGINT", syscall.SIGINT, false},
		{"SIGTERM as PID 1", syscall.SIGTERM, true},
		{"SIGINT as PID 1", syscall.SIGINT, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.pidNS {
				needRoot(t, "make a PID namespace")
			}
			c := startPause(t, bin, tc.pidNS)
			if err := c.Process.Signal(tc.sig); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- c.Wait() }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("pause after %v: %v, want exit 0", tc.sig, err)
				}
			case <-time.After(5 * time.Second):
				c.Process.Kill()
				<-done
				t.Fatalf("pause still running 5 s after %v", tc.sig)
			}
		})
	}
}

// TestPauseReapsOrphans orphans a process in pause's PID namespace, where
// the kernel makes pause its parent, and checks that it leaves no zombie
// when it exits. The control row runs sleep as PID 1 instead, which reaps
// nothing, to show that the check sees zombies.
func TestPauseReapsOrphans(t *testing.T) {
	bin := pauseBinary(t)
	needRoot(t, "make a PID namespace and enter it")
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		skipOrFail(t, "needs nsenter (util-linux) to start a process in pause's PID namespace")
	}
	for _, tc := range []struct {
		name       string
		pid1       func(t *testing.T) *exec.Cmd
		wantZombie bool
	}{
		{"pause reaps", func(t *testing.T) *exec.Cmd { return startPause(t, bin, true) }, false},
		{"control: sleep as PID 1 leaves a zombie", func(t *testing.T) *exec.Cmd {
			c := exec.Command("sleep", "60")
			c.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Process.Kill(); c.Wait() })
			return c
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pid1 := tc.pid1(t).Process.Pid
			// sh exits at once; its background sleep is orphaned to PID 1. The
			// sleep must not hold nsenter's output pipe, or CombinedOutput
			// would wait for it to exit.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, nsenter, "--target", strconv.Itoa(pid1), "--pid", "--",
				"sh", "-c", "sleep 2 </dev/null >/dev/null 2>&1 & exit 0").CombinedOutput()
			if err != nil {
				t.Fatalf("nsenter: %v\n%s", err, out)
			}
			// The orphan shows up as PID 1's child first, then goes away (reaped)
			// or stays a zombie.
			kids := children(t, pid1)
			if len(kids) != 1 || kids[0].comm != "sleep" {
				t.Fatalf("children of PID 1 (%d) right after sh exited: %+v, want the orphaned sleep", pid1, kids)
			}
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				kids = children(t, pid1)
				if tc.wantZombie && len(kids) == 1 && kids[0].state == "Z" {
					return
				}
				if !tc.wantZombie && len(kids) == 0 {
					return
				}
			}
			t.Fatalf("children of PID 1 (%d) 5 s later: %+v; want a zombie: %v", pid1, kids, tc.wantZombie)
		})
	}
}

// startPause starts the pause binary, optionally as PID 1 of a new PID
// namespace, and returns once its signal.Notify has run: a signal sent
// earlier would kill it. Go installs its own SIGTERM handler at start, so
// /proc cannot show when Notify ran, except for a SIGINT that was ignored
// at start: only Notify installs a handler for it. So pause starts through
// sh with SIGINT ignored, and is ready when it catches SIGINT.
func startPause(t *testing.T, bin string, pidNS bool) *exec.Cmd {
	t.Helper()
	// exec keeps the PID (1 in the new namespace) and the ignored SIGINT.
	c := exec.Command("sh", "-c", `trap "" INT; exec "$0"`, bin)
	if pidNS {
		c.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c.ProcessState == nil {
			c.Process.Kill()
			c.Wait()
		}
	})
	sigint := uint64(1) << (syscall.SIGINT - 1)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		caught, err := sigCaught(c.Process.Pid)
		if err == nil && caught&sigint != 0 && procComm(c.Process.Pid) == "pause" {
			return c
		}
	}
	t.Fatalf("pause (pid %d) does not handle SIGINT after 5 s", c.Process.Pid)
	return nil
}

// procComm is the command name of process pid ("" if gone).
func procComm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

// sigCaught is the mask of signals process pid has handlers for.
func sigCaught(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "SigCgt:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, errors.New("no SigCgt")
}

type proc struct {
	pid   int
	state string
	comm  string
}

// children lists the processes whose parent is ppid, zombies included.
func children(t *testing.T, ppid int) []proc {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		if p, _ := strconv.Atoi(f[1]); p == ppid {
			out = append(out, proc{pid: pid, state: f[0], comm: s[strings.IndexByte(s, '(')+1 : i]})
		}
	}
	return out
}
