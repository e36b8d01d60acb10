// Package proc runs the lab's child processes (brokers, sidecar, agent): each in
// its own process group, its output in a file and optionally streamed line by
// line, stopped with SIGTERM then SIGKILL. Test infrastructure; product code
// never imports it.
package proc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Proc is a child process in its own process group, with its output in a file and,
// optionally, streamed line by line to a callback.
type Proc struct {
	Name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start starts bin with args; its output goes to logPath (appended) and, when
// onLine is not nil, to onLine one line at a time.
func Start(name, logPath string, onLine func(string), bin string, args ...string) (*Proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	// Own process group (Stop signals all it started); SIGKILL if the lab process
	// dies in any way, so a killed test leaves no broker or agent behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Stdout, cmd.Stderr = logf, logf
	var pw *io.PipeWriter
	if onLine != nil {
		var pr *io.PipeReader
		pr, pw = io.Pipe()
		w := io.MultiWriter(logf, pw)
		cmd.Stdout, cmd.Stderr = w, w
		go func() {
			sc := bufio.NewScanner(pr)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				onLine(sc.Text())
			}
			_, _ = io.Copy(io.Discard, pr)
		}()
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		if pw != nil {
			pw.Close()
		}
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		if pw != nil {
			pw.Close()
		}
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// PID is the process ID (and process group ID).
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Signal sends sig to the process.
func (p *Proc) Signal(sig syscall.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop ends the process group: SIGTERM, then SIGKILL after grace.
func (p *Proc) Stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.PID(), syscall.SIGCONT) // a frozen process cannot exit
	_ = syscall.Kill(-p.PID(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
		<-p.done
	}
}

// Kill sends SIGKILL to the process group and waits for the exit; a
// process already reaped is not signalled (its ID may be another's now).
func (p *Proc) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
	<-p.done
}

// FreeAddr returns a loopback address whose port was free a moment ago.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// WaitListening waits until addr accepts connections or the process exits.
func WaitListening(ctx context.Context, p *Proc, addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before listening on %s: %v", p.Name, addr, p.err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not listening on %s after %v", p.Name, addr, timeout)
		}
	}
}

// Usage reads a process's CPU time (user+system) and resident set size.
func Usage(pid int) (cpu time.Duration, rss int64, err error) {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, 0, err
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(stat), ')')
	if i < 0 {
		return 0, 0, errors.New("malformed /proc stat")
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 22 {
		return 0, 0, errors.New("short /proc stat")
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	rssPages, _ := strconv.ParseInt(f[21], 10, 64)
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticks, rssPages * int64(os.Getpagesize()), nil
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is the process's exit error; valid once Done is closed.
func (p *Proc) Err() error { return p.err }

// MosquittoStaysUser is the configuration line that lets a Mosquitto broker
// die with the process that started it (Pdeathsig): started as root, Mosquitto
// changes to its own user, and a change of credentials clears the
// parent-death signal, so a killed test or lab run would leave it running. As
// root it is told to stay root; as anyone else it changes nothing and the line
// is empty.
func MosquittoStaysUser() string {
	if os.Geteuid() == 0 {
		return "user root\n"
	}
	return ""
}
