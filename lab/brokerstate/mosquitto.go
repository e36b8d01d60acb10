package brokerstate

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/amf-edge/amf/lab/proc"
)

// Mosquitto is a Mosquitto process on loopback with its persistence file in
// a folder of its own, which can be restarted on the same port and file as
// a kubelet restarts a container whose process died.
type Mosquitto struct {
	Addr string // 127.0.0.1:port
	File string // its persistence file
	bin  string
	conf string
	Log  *Log

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	err    error
}

// Log is a broker's output, safe to read while it runs.
type Log struct {
	mu sync.Mutex
	b  []byte
}

func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	return len(p), nil
}

func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}

// StartMosquitto starts bin with persistence on (autosave only on request,
// on SIGUSR1 and at exit) or off, in dir, and waits until it listens. It dies
// with the process that started it.
func StartMosquitto(ctx context.Context, bin, dir string, persistence bool) (*Mosquitto, error) {
	addr, err := proc.FreeAddr()
	if err != nil {
		return nil, err
	}
	_, port, _ := net.SplitHostPort(addr)
	m := &Mosquitto{Addr: addr, File: filepath.Join(dir, "mosquitto.db"), bin: bin, conf: filepath.Join(dir, "mosquitto.conf"), Log: &Log{}}
	conf := fmt.Sprintf("listener %s 127.0.0.1\nallow_anonymous true\nlog_dest stderr\nlog_type error\nlog_type warning\n%spersistence %v\npersistence_location %s/\nautosave_interval 0\n",
		port, proc.MosquittoStaysUser(), persistence, dir)
	if err := os.WriteFile(m.conf, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	return m, m.Start(ctx)
}

// Start starts the broker (again) and waits until it listens.
func (m *Mosquitto) Start(ctx context.Context) error {
	m.mu.Lock()
	cmd := exec.Command(m.bin, "-c", m.conf)
	cmd.Stdout, cmd.Stderr = m.Log, m.Log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		m.mu.Unlock()
		return fmt.Errorf("start mosquitto: %w", err)
	}
	exited := make(chan struct{})
	m.cmd, m.exited, m.err = cmd, exited, nil
	m.mu.Unlock()
	go func() {
		err := cmd.Wait()
		m.mu.Lock()
		m.err = err
		m.mu.Unlock()
		close(exited)
	}()
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		if c, err := net.Dial("tcp", m.Addr); err == nil {
			c.Close()
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("mosquitto exited before listening on %s: %v\n%s", m.Addr, m.Err(), m.Log.String())
		case <-ctx.Done():
			return fmt.Errorf("mosquitto not listening on %s: %w", m.Addr, ctx.Err())
		case <-time.After(delay):
		}
	}
}

// PID is the running process's.
func (m *Mosquitto) PID() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cmd.Process.Pid
}

// Exited is closed when the current process has ended.
func (m *Mosquitto) Exited() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.exited
}

// Err is the current process's exit error, once Exited is closed.
func (m *Mosquitto) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// Signal sends sig to the current process.
func (m *Mosquitto) Signal(sig syscall.Signal) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cmd.Process.Signal(sig)
}

// WaitExit waits for the current process to end and returns its exit error.
func (m *Mosquitto) WaitExit(ctx context.Context) error {
	select {
	case <-m.Exited():
		return m.Err()
	case <-ctx.Done():
		return fmt.Errorf("mosquitto still running: %w", ctx.Err())
	}
}

// Kill ends the current process, paused or not, and waits for it.
func (m *Mosquitto) Kill() {
	select {
	case <-m.Exited():
		return
	default:
	}
	_ = m.Signal(syscall.SIGCONT)
	if err := m.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return
	}
	<-m.Exited()
}
