package node

import (
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// EventType is what happened to a container.
type EventType string

// The container lifecycle events.
const (
	// EventStarted: the container's process was started for the first time
	// (RestartCount 0); PID is set.
	EventStarted EventType = "started"
	// EventRestarted: the container's process was started again (RestartCount > 0).
	EventRestarted EventType = "restarted"
	// EventExited: the process ended: ExitCode, Signal (0 unless killed by a
	// signal) and Reason (Completed, Error, OOMKilled) are set. Every start
	// has exactly one Exited.
	EventExited EventType = "exited"
	// EventOOMKilled: the kernel OOM-killed a process of the container (Time
	// is when the notification arrived); the node then kills the rest of it.
	EventOOMKilled EventType = "oom-killed"
	// EventBackOff: the container will be restarted after Delay (CrashLoopBackOff).
	EventBackOff EventType = "back-off"
	// EventReady and EventNotReady: the container's readiness changed.
	EventReady    EventType = "ready"
	EventNotReady EventType = "not-ready"
	// EventStopped: the node stopped the container for good because the pod
	// was deleted or the node shut down; after its Exited if it was running.
	EventStopped EventType = "stopped"
	// EventFailed: the container could not be created or started; Reason is
	// the waiting reason (ErrImagePull, CreateContainerConfigError,
	// CreateContainerError) and Message says why.
	EventFailed EventType = "failed"
)

// Event is one container lifecycle event.
type Event struct {
	Time         time.Time // when it happened (the node's clock), not rounded
	Type         EventType
	Namespace    string
	Pod          string
	UID          types.UID
	Container    string
	ContainerID  string // 64 hex digits, new at every start
	PID          int    // of the container's process, when it has one
	RestartCount int32
	ExitCode     int            // Exited
	Signal       syscall.Signal // Exited: the signal that ended the process, or 0
	Reason       string         // Exited: Completed, Error or OOMKilled; Failed: the waiting reason; Stopped/Exited: why it was killed, if it was
	Message      string
	Delay        time.Duration // BackOff
}

// eventBuffer is the channel capacity of each subscription.
const eventBuffer = 4096

// hub fans events out to subscribers without ever blocking the node.
type hub struct {
	mu      sync.Mutex
	subs    map[*subscription]struct{}
	dropped atomic.Uint64
}

type subscription struct {
	ch      chan Event
	dropped uint64 // guarded by hub.mu
}

func (h *hub) subscribe() (<-chan Event, func()) {
	s := &subscription{ch: make(chan Event, eventBuffer)}
	h.mu.Lock()
	if h.subs == nil {
		h.subs = map[*subscription]struct{}{}
	}
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	var once sync.Once
	return s.ch, func() {
		once.Do(func() {
			h.mu.Lock()
			delete(h.subs, s)
			close(s.ch)
			h.mu.Unlock()
		})
	}
}

// publish delivers ev to every subscriber whose buffer has room and counts
// the others' losses.
func (h *hub) publish(ev Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		select {
		case s.ch <- ev:
		default:
			s.dropped++
			h.dropped.Add(1)
		}
	}
}
