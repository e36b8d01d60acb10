// Package handover takes a Mosquitto broker's state out of its pod and puts
// a state into another: the sidecar's two levers for carrying retained
// messages, persistent sessions and their queues across a switchover or a
// failover (DESIGN.md, "Broker state").
//
// The state is Mosquitto's own persistence file (mosquitto.db), moved whole.
// Mosquitto writes it on SIGUSR1, on its autosave timer and as it stops, each
// time to <file>.new renamed into place, so a reader sees an old file or a
// new one, never a torn one; the rename is awaited by inotify, not polled.
// It reads the file only when it starts, so a state is put in by replacing
// the file under a paused broker and killing it: its kubelet starts it again
// on the new file (the first restart of a container is immediate). SIGKILL,
// not SIGTERM: a stopping Mosquitto saves its own state over the file.
//
// In a pod this needs what the fence needs (the pod's shared process
// namespace and the broker's user, package pause) and the broker's data
// volume mounted into the sidecar.
package handover

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/amf-edge/amf/mosquittodb"
	"github.com/amf-edge/amf/pause"
)

// DefaultComm is the process name of Mosquitto (/proc/<pid>/comm).
const DefaultComm = "mosquitto"

// Broker is the Mosquitto of one container, as the sidecar sees it.
type Broker struct {
	// Container is the broker's container. With no Leaf, every process of
	// the name Comm that this process sees is the broker's: in a pod that
	// shares its process namespace, the pod's.
	Container pause.Container
	// File is the broker's persistence file as this process sees it (the
	// broker's persistence_location and persistence_file, under the data
	// volume's mount in the sidecar).
	File string
	// Comm is the broker's process name; default DefaultComm. Only those
	// processes are signalled: SIGUSR1 ends a process that does not handle
	// it, such as a shell that started the broker.
	Comm string
	// PID, when not 0, is the broker's process, and the only one signalled.
	PID int
}

// State is one persistence file and what it holds.
type State struct {
	Data    []byte
	Summary mosquittodb.Summary
	// Written is when the file was renamed into place, on this process's clock.
	Written time.Time
}

// MaxStateBytes bounds a state the sidecar holds: it holds it in memory,
// within its own limit (48 MiB as inject writes it). A larger file is
// refused with the reason, never half read.
const MaxStateBytes = 24 << 20

// ErrTooLarge is wrapped when a state is over MaxStateBytes.
var ErrTooLarge = fmt.Errorf("handover: state over %d MiB, more than the sidecar holds in memory", MaxStateBytes>>20)

// ErrNoBroker is returned when the container has no process of the
// broker's name that this process can see.
var ErrNoBroker = errors.New("handover: no broker process visible")

func (b Broker) comm() string {
	if b.Comm == "" {
		return DefaultComm
	}
	return b.Comm
}

// pids are the container's processes named Comm.
func (b Broker) pids() ([]int, error) {
	proc := b.Container.Proc
	if proc == "" {
		proc = "/proc"
	}
	var all []int
	switch {
	case b.PID != 0:
		all = []int{b.PID}
	case b.Container.Leaf == "":
		entries, err := os.ReadDir(proc)
		if err != nil {
			return nil, fmt.Errorf("handover: list processes: %w", err)
		}
		for _, e := range entries {
			if pid, err := strconv.Atoi(e.Name()); err == nil && pid != os.Getpid() {
				all = append(all, pid)
			}
		}
	default:
		var err error
		if all, err = b.Container.PIDs(); err != nil {
			return nil, err
		}
	}
	var pids []int
	for _, pid := range all {
		comm, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "comm"))
		if err == nil && strings.TrimSpace(string(comm)) == b.comm() {
			pids = append(pids, pid)
		}
	}
	if len(pids) == 0 {
		where := "among the processes visible here"
		if b.PID != 0 {
			where = "at pid " + strconv.Itoa(b.PID)
		} else if b.Container.Leaf != "" {
			where = "in container cgroup " + b.Container.Leaf
		}
		return nil, fmt.Errorf("%w: no process named %q %s (the pod must share its process namespace: shareProcessNamespace: true)", ErrNoBroker, b.comm(), where)
	}
	return pids, nil
}

func (b Broker) signal(sig syscall.Signal) error {
	pids, err := b.pids()
	if err != nil {
		return err
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("handover: %v to broker process %d: %w (the sidecar needs the broker's user)", sig, pid, err)
		}
	}
	return nil
}

// Snapshot has the broker write its state now (SIGUSR1) and returns the file
// once it is in place. A broker without persistence ignores the signal, and
// Snapshot then waits until ctx ends.
func (b Broker) Snapshot(ctx context.Context) (State, error) {
	w, err := watch(b.File)
	if err != nil {
		return State{}, err
	}
	defer w.close()
	if err := b.signal(syscall.SIGUSR1); err != nil {
		return State{}, err
	}
	if err := w.next(ctx); err != nil {
		return State{}, fmt.Errorf("handover: the broker did not write %s after SIGUSR1 (is persistence on, with this file?): %w", b.File, err)
	}
	return read(b.File)
}

// Final waits for the file the broker writes as it stops (its kubelet's
// SIGTERM): a state after which nothing happened in this broker. started
// is called once the wait is armed, so that the stop can be asked for
// without a race.
func (b Broker) Final(ctx context.Context, started func()) (State, error) {
	w, err := watch(b.File)
	if err != nil {
		return State{}, err
	}
	defer w.close()
	if started != nil {
		started()
	}
	for {
		if err := w.next(ctx); err != nil {
			return State{}, fmt.Errorf("handover: no final state in %s: %w", b.File, err)
		}
		s, err := read(b.File)
		if err != nil || s.Summary.Shutdown {
			return s, err
		}
		// An autosave before the stop: wait on.
	}
}

// Install replaces the broker's state with data and restarts the broker on
// it: the file is checked first (a torn or foreign one is refused and
// nothing is changed), the broker paused so that it cannot save over it,
// the file written beside its place and renamed there, and the broker
// killed for its kubelet to start again.
func (b Broker) Install(data []byte) (mosquittodb.Summary, error) {
	if len(data) > MaxStateBytes {
		return mosquittodb.Summary{Bytes: len(data)}, fmt.Errorf("%w (%d bytes)", ErrTooLarge, len(data))
	}
	sum, err := mosquittodb.Read(data)
	if err != nil {
		return sum, fmt.Errorf("handover: refused state: %w", err)
	}
	if err := b.signal(syscall.SIGSTOP); err != nil {
		return sum, err
	}
	if err := writeFile(b.File, data); err != nil {
		// Resumed as it was: its own state stays.
		return sum, errors.Join(err, b.signal(syscall.SIGCONT))
	}
	return sum, b.signal(syscall.SIGKILL)
}

// writeFile puts data at path as Mosquitto does: a new file beside it,
// synced, renamed into place, the folder synced.
func writeFile(path string, data []byte) error {
	tmp := path + ".amf-new"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("handover: %w", err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("handover: write %s: %w", path, err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

func read(path string) (State, error) {
	at := time.Now()
	f, err := os.Open(path)
	if err != nil {
		return State{}, fmt.Errorf("handover: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxStateBytes+1))
	if err != nil {
		return State{}, fmt.Errorf("handover: %w", err)
	}
	if len(data) > MaxStateBytes {
		return State{}, fmt.Errorf("%w: %s", ErrTooLarge, path)
	}
	sum, err := mosquittodb.Read(data)
	if err != nil {
		return State{}, fmt.Errorf("handover: %s: %w", path, err)
	}
	return State{Data: data, Summary: sum, Written: at}, nil
}

// renames is an inotify watch on a file's folder for files renamed to its name.
type renames struct {
	f    *os.File
	name string
}

func watch(path string) (*renames, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("handover: inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, filepath.Dir(path), unix.IN_MOVED_TO); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("handover: watch %s: %w", filepath.Dir(path), err)
	}
	// Non-blocking, so the runtime's poller serves it and a deadline ends a read.
	return &renames{f: os.NewFile(uintptr(fd), "inotify"), name: filepath.Base(path)}, nil
}

func (w *renames) close() { _ = w.f.Close() }

// next returns once a file is renamed to the watched name, or ctx ends.
func (w *renames) next(ctx context.Context) error {
	// A deadline set when an earlier ctx ended would end this read at once.
	if err := w.f.SetReadDeadline(time.Time{}); err != nil {
		return fmt.Errorf("handover: inotify: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = w.f.SetReadDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("handover: inotify: %w", err)
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			// struct inotify_event: int wd, uint32 mask, cookie, len, then the name.
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			nameLen := int(binary.NativeEndian.Uint32(buf[off+12:]))
			start := off + unix.SizeofInotifyEvent
			if start+nameLen > n {
				break
			}
			name := strings.TrimRight(string(buf[start:start+nameLen]), "\x00")
			if mask&unix.IN_MOVED_TO != 0 && name == w.name {
				return nil
			}
			off = start + nameLen
		}
	}
}
