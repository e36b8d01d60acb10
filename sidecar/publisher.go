package sidecar

import (
	"context"
	"sync"
	"time"

	"github.com/amf-edge/amf/podsignal"
)

// Publisher sends a pod's signals to whoever decides on them. *Signaller
// (MQTT to the node agent) is the real one; Recorder is a fake for tests of
// what is sent.
type Publisher interface {
	// Run keeps the connection until ctx ends.
	Run(ctx context.Context) error
	// Publish sends m, or keeps it to send once connected.
	Publish(m podsignal.Message) error
	// Close sends final and disconnects, waiting at most timeout.
	Close(final podsignal.Message, timeout time.Duration) error
}

// Commanded is a Publisher that also hears the node agent's commands to
// the pod (the fence): *Signaller, over the same connection.
type Commanded interface {
	Commands() <-chan podsignal.Command
}

var (
	_ Publisher = (*Signaller)(nil)
	_ Commanded = (*Signaller)(nil)
)

// Recorder is a Publisher that keeps what it is given, in order.
type Recorder struct {
	mu     sync.Mutex
	msgs   []podsignal.Message
	closed bool
	sent   chan struct{} // closed and replaced at every message
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder { return &Recorder{sent: make(chan struct{})} }

// Run waits for ctx to end.
func (r *Recorder) Run(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

// Publish records m.
func (r *Recorder) Publish(m podsignal.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, m)
	close(r.sent)
	r.sent = make(chan struct{})
	return nil
}

// Close records final as the last message.
func (r *Recorder) Close(final podsignal.Message, _ time.Duration) error {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	return r.Publish(final)
}

// Messages returns what was published so far, and a channel closed at the
// next message (to wait on without polling).
func (r *Recorder) Messages() ([]podsignal.Message, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]podsignal.Message(nil), r.msgs...), r.sent
}

// Closed reports whether Close was called.
func (r *Recorder) Closed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}
