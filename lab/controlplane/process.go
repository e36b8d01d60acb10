package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/amf-edge/amf/lab/proc"
)

// errPortTaken marks a start that failed because a port picked as free was taken
// meanwhile (by another test); Start retries with new ports.
var errPortTaken = errors.New("port already in use")

// errKwokRace marks kwok's crash at start on its own data race: v0.8.0's CEL
// helper (easycel v0.6.0) fills package-level type caches without a lock, and
// kwok's controllers build their stages' environments concurrently when the
// first node appears ("fatal error: concurrent map writes"; once in about 200
// starts with four test binaries in parallel). Nothing of ours is involved, and
// kwok keeps no state of its own, so Start retries as for a taken port.
var errKwokRace = errors.New("kwok crashed on its start-up data race")

// process is one component: a child process in its own process group, with its
// output in a log file.
type process struct {
	name    string
	path    string
	args    []string
	env     []string
	logPath string

	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited and been reaped
	err  error         // exit status, valid once done is closed
}

func (p *process) start() error {
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "=== %s %s %s\n", time.Now().Format(time.RFC3339Nano), p.path, strings.Join(p.args, " "))
	cmd := exec.Command(p.path, p.args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = p.env
	// Own process group, so stop can signal everything the component started;
	// SIGKILL if the test binary dies (panic, -timeout) so nothing is left behind.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.cmd, p.done, p.err = cmd, make(chan struct{}), nil
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return nil
}

func (p *process) running() bool {
	if p == nil || p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// exitError describes an unexpected exit, with the end of the log.
func (p *process) exitError() error {
	tail := p.logTail(4 << 10)
	err := fmt.Errorf("%s exited: %v; log %s ends with:\n%s", p.name, p.err, p.logPath, tail)
	switch {
	case strings.Contains(tail, "address already in use"):
		err = fmt.Errorf("%w: %w", errPortTaken, err)
	case p.name == "kwok" && isGoMapRace(tail):
		err = fmt.Errorf("%w: %w", errKwokRace, err)
	}
	return err
}

// isGoMapRace says whether a Go program's log ends in the runtime's fatal
// error on unsynchronised map use.
func isGoMapRace(tail string) bool {
	return strings.Contains(tail, "fatal error: concurrent map writes") ||
		strings.Contains(tail, "fatal error: concurrent map read and map write")
}

// stop sends SIGTERM to the process group, and SIGKILL after grace.
func (p *process) stop(grace time.Duration) {
	if !p.running() {
		return
	}
	pgid := p.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-p.done
	}
}

// logTail returns at most n bytes from the end of the log, starting at a line.
func (p *process) logTail(n int64) string { return proc.LogTail(p.logPath, n) }

// freePorts returns n distinct free TCP ports on 127.0.0.1. They are released
// before use, so another process may take one meanwhile: Start retries then.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// poll calls probe with a bounded exponential backoff (10 ms doubling to 500 ms)
// until it succeeds or ctx ends (see untilExit: also when a component exits).
func poll(ctx context.Context, what string, probe func(context.Context) error) error {
	delay := 10 * time.Millisecond
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := probe(pctx)
		cancel()
		if err == nil {
			return nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("waiting for %s: %w (last error: %v)", what, context.Cause(ctx), err)
		case <-t.C:
		}
		delay = min(2*delay, 500*time.Millisecond)
	}
}

// childEnv is the environment of the components: the test's, without variables
// that would change what they do (KUBECONFIG, etcd's ETCD_* flags), with HOME in
// the temp dir (kwok reads ~/.kwok, kubectl writes ~/.kube/cache).
func childEnv(home string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "HOME" || k == "KUBECONFIG" || strings.HasPrefix(k, "ETCD_") || strings.HasPrefix(k, "KWOK_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "HOME="+home)
}

func itoa(i int) string { return strconv.Itoa(i) }
