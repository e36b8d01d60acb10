package agent

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amf-edge/amf/podsignal"
)

// Reasons a valid signal is ignored (label "reason" of amf_agent_messages_ignored_total).
const (
	ignoredDuplicate  = "duplicate_seq" // seq not above the last one of the session
	ignoredSuperseded = "superseded"    // a newer session of the same pod exists
)

// Transition is one change of a pod's state.
type Transition struct {
	From     podsignal.State // "" for the first signal of a pod
	To       podsignal.State
	Source   podsignal.Source
	Seq      uint64 // seq of the message; 0 for podsignal.SourceDisconnect
	Received time.Time
}

// PodState is what the agent knows about one pod. Message and the values it
// points to are shared and must not be modified.
type PodState struct {
	podsignal.PodID
	// State is the latest state; "" while a session is open but nothing was sent.
	State    podsignal.State
	Source   podsignal.Source
	Message  *podsignal.Message // latest accepted message (publish or will); nil if none
	Received time.Time          // when the latest observation was made
	// Connected reports whether the pod's current session is open.
	Connected bool
	// Session numbers the pod's latest session (agent-wide, increasing).
	Session uint64
	// History holds the latest transitions, oldest first.
	History []Transition
}

// session is one authenticated MQTT connection: one run of a sidecar.
type session struct {
	id       uint64
	identity podsignal.PodID
	topic    string // identity.Topic(), computed once for the ACL
	// commandTopic is podsignal.CommandTopic of the identity: the client may
	// subscribe to it, not publish.
	commandTopic string
	clientID     string
	// local: the agent runs the pod's pipeline itself (node mode); no MQTT
	// connection, so no connection metrics.
	local bool
	ended atomic.Bool
}

type podRecord struct {
	st         PodState // History is kept in history
	history    []Transition
	seqSeen    bool   // a message of the current session was accepted
	lastSeq    uint64 // its seq
	lastActive time.Time
}

type subscriber struct {
	ch     chan podsignal.Observation
	missed uint64
}

// Tracker keeps the latest state of every pod and tells subscribers about each
// observation. It is safe for concurrent use.
type Tracker struct {
	log        *slog.Logger
	m          *metrics
	historyLen int
	now        func() time.Time

	mu          sync.Mutex
	pods        map[podsignal.PodID]*podRecord
	lastSession uint64
	subs        map[*subscriber]struct{}
	closed      bool
	done        chan struct{} // closed by shutdown
}

func newTracker(log *slog.Logger, m *metrics, historyLen int, now func() time.Time) *Tracker {
	return &Tracker{
		log:        log,
		m:          m,
		historyLen: historyLen,
		now:        now,
		pods:       make(map[podsignal.PodID]*podRecord),
		subs:       make(map[*subscriber]struct{}),
		done:       make(chan struct{}),
	}
}

// Subscribe returns a channel that receives every accepted observation (a signal, a
// Last Will, the end of a session) from now on, until ctx ends or the agent
// stops; then the channel is closed. Observations of one pod arrive in the
// order the agent accepted them. Delivery never blocks
// the broker: when the buffer (buffer events, 256 if buffer <= 0) is full, the
// event is dropped for this subscriber and counted in the next one's Missed.
func (t *Tracker) Subscribe(ctx context.Context, buffer int) <-chan podsignal.Observation {
	if buffer <= 0 {
		buffer = 256
	}
	s := &subscriber{ch: make(chan podsignal.Observation, buffer)}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		close(s.ch)
		return s.ch
	}
	t.subs[s] = struct{}{}
	t.mu.Unlock()
	go func() {
		select {
		case <-ctx.Done():
		case <-t.done:
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		if _, ok := t.subs[s]; ok {
			delete(t.subs, s)
			close(s.ch)
		}
	}()
	return s.ch
}

// Pods returns the state of every known pod, sorted by namespace and pod.
func (t *Tracker) Pods() []PodState {
	t.mu.Lock()
	out := make([]PodState, 0, len(t.pods))
	for _, rec := range t.pods {
		out = append(out, rec.snapshot())
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b PodState) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Pod, b.Pod))
	})
	return out
}

// Pod returns the state of one pod.
func (t *Tracker) Pod(id podsignal.PodID) (PodState, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rec, ok := t.pods[id]
	if !ok {
		return PodState{}, false
	}
	return rec.snapshot(), true
}

// len returns the number of known pods.
func (t *Tracker) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.pods)
}

func (rec *podRecord) snapshot() PodState {
	st := rec.st
	st.History = slices.Clone(rec.history)
	return st
}

// begin opens a session for id; it replaces any earlier session of the pod.
// It returns nil once the agent is shutting down.
func (t *Tracker) begin(id podsignal.PodID, clientID string) *session {
	return t.beginSession(id, clientID, false)
}

func (t *Tracker) beginSession(id podsignal.PodID, clientID string, local bool) *session {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.lastSession++
	s := &session{id: t.lastSession, identity: id, topic: id.Topic(), commandTopic: id.CommandTopic(), clientID: clientID, local: local}
	rec := t.pods[id]
	if rec == nil {
		rec = &podRecord{st: PodState{PodID: id}}
		t.pods[id] = rec
	}
	rec.st.Session = s.id
	rec.st.Connected = true
	rec.seqSeen = false // a new run: its seq starts anywhere
	rec.lastActive = now
	if !local {
		t.m.sessions.Inc()
	}
	return s
}

// LocalSession is one run of a pipeline the agent itself runs for a pod
// (node mode), recorded as a sidecar's session is: its messages are
// observations with source podsignal.SourceNode, deduplicated by seq, delivered to
// the same subscribers (the actuator), and End is the session's end. A new
// session of the pod, local or a sidecar's, supersedes it.
type LocalSession struct {
	t *Tracker
	s *session
}

// BeginLocal opens a local session for id. It returns nil once the agent is
// shutting down.
func (t *Tracker) BeginLocal(id podsignal.PodID) *LocalSession {
	s := t.beginSession(id, "node", true)
	if s == nil {
		return nil
	}
	return &LocalSession{t: t, s: s}
}

// Observe records a message of the pod's pipeline, received at the time
// given (when the pipeline produced it).
func (l *LocalSession) Observe(msg *podsignal.Message, received time.Time) {
	l.t.record(l.s, msg, podsignal.SourceNode, received)
}

// End ends the session: the pod becomes gone unless its last state was
// stopping (send the pipeline's Stop message first when the pod goes away
// in order). Not recorded while the agent shuts down; calling it again does
// nothing.
func (l *LocalSession) End() { l.t.end(l.s, true) }

// publish records a decoded signal of session s.
func (t *Tracker) publish(s *session, msg *podsignal.Message, received time.Time) {
	t.record(s, msg, podsignal.SourcePublish, received)
}

// record records a message of session s that came from src.
func (t *Tracker) record(s *session, msg *podsignal.Message, src podsignal.Source, received time.Time) {
	t.mu.Lock()
	rec := t.pods[s.identity]
	if rec == nil || rec.st.Session != s.id {
		t.mu.Unlock()
		t.ignore(s, ignoredSuperseded, msg.Seq)
		return
	}
	if rec.seqSeen && msg.Seq <= rec.lastSeq {
		last := rec.lastSeq
		t.mu.Unlock()
		t.ignore(s, ignoredDuplicate, msg.Seq, slog.Uint64("last_seq", last))
		return
	}
	rec.seqSeen, rec.lastSeq = true, msg.Seq
	t.m.messages.WithLabelValues(string(msg.State), string(src)).Inc()
	ev := t.observe(rec, msg.State, src, msg, received)
	t.mu.Unlock()
	t.logObservation(ev)
}

// will records the Last Will of session s, sent by the broker.
func (t *Tracker) will(s *session, msg *podsignal.Message, received time.Time) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	rec := t.pods[s.identity]
	if rec == nil || rec.st.Session != s.id {
		t.mu.Unlock()
		t.ignore(s, ignoredSuperseded, msg.Seq, slog.String("source", string(podsignal.SourceWill)))
		return
	}
	t.m.messages.WithLabelValues(string(msg.State), string(podsignal.SourceWill)).Inc()
	ev := t.observe(rec, msg.State, podsignal.SourceWill, msg, received)
	t.mu.Unlock()
	t.logObservation(ev)
}

// end closes session s; clean reports an MQTT DISCONNECT. The pod becomes gone
// unless it said it was stopping. Calling end again for s does nothing.
func (t *Tracker) end(s *session, clean bool) {
	if !s.ended.CompareAndSwap(false, true) {
		return
	}
	if !s.local {
		t.m.sessions.Dec()
	}
	now := t.now()
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	rec := t.pods[s.identity]
	if rec == nil || rec.st.Session != s.id {
		t.mu.Unlock()
		if !s.local {
			t.m.disconnects.WithLabelValues("superseded").Inc()
		}
		t.log.Debug("session of a replaced connection ended", slog.String("pod", s.identity.String()), slog.Uint64("session", s.id))
		return
	}
	switch {
	case s.local:
	case clean:
		t.m.disconnects.WithLabelValues("clean").Inc()
	default:
		t.m.disconnects.WithLabelValues("unclean").Inc()
	}
	rec.st.Connected = false
	state := podsignal.Gone
	if rec.st.State == podsignal.Stopping {
		state = podsignal.Stopping
	}
	src := podsignal.SourceDisconnect
	if s.local {
		src = podsignal.SourceNode
	}
	ev := t.observe(rec, state, src, nil, now)
	t.mu.Unlock()
	t.logObservation(ev)
}

// observe applies an accepted observation to rec and dispatches its event.
// The caller holds t.mu.
func (t *Tracker) observe(rec *podRecord, state podsignal.State, src podsignal.Source, msg *podsignal.Message, received time.Time) podsignal.Observation {
	prev := rec.st.State
	ev := podsignal.Observation{
		PodID: rec.st.PodID, State: state, Previous: prev, Transition: state != prev,
		Source: src, Message: msg, Received: received, Session: rec.st.Session,
	}
	if ev.Transition {
		if prev != "" {
			t.m.pods.WithLabelValues(string(prev)).Dec()
		}
		t.m.pods.WithLabelValues(string(state)).Inc()
		tr := Transition{From: prev, To: state, Source: src, Received: received}
		if msg != nil {
			tr.Seq = msg.Seq
		}
		if len(rec.history) == t.historyLen {
			copy(rec.history, rec.history[1:])
			rec.history = rec.history[:len(rec.history)-1]
		}
		rec.history = append(rec.history, tr)
	}
	rec.st.State = state
	rec.st.Source = src
	rec.st.Received = received
	if msg != nil {
		rec.st.Message = msg
	}
	rec.lastActive = received
	for s := range t.subs {
		ev.Missed = s.missed
		select {
		case s.ch <- ev:
			s.missed = 0
		default:
			s.missed++
			t.m.eventsDropped.Inc()
		}
	}
	ev.Missed = 0
	return ev
}

// logObservation writes the one log line of a transition; other observations
// are logged at debug level only (a pod sends one per second while anomalous).
func (t *Tracker) logObservation(ev podsignal.Observation) {
	level, msg := slog.LevelDebug, "signal"
	if ev.Transition {
		level, msg = slog.LevelInfo, "transition"
	}
	ctx := context.Background()
	if !t.log.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 12)
	attrs = append(attrs,
		slog.String("namespace", ev.Namespace), slog.String("pod", ev.Pod),
		slog.String("from", string(ev.Previous)), slog.String("to", string(ev.State)),
		slog.String("source", string(ev.Source)), slog.Uint64("session", ev.Session),
		slog.Time("received", ev.Received))
	if m := ev.Message; m != nil {
		attrs = append(attrs, slog.Uint64("seq", m.Seq), slog.Time("sample_time", m.Time))
		if m.Probability != nil {
			attrs = append(attrs, slog.Float64("probability", *m.Probability))
		}
		if m.Reason != "" {
			attrs = append(attrs, slog.String("reason", m.Reason))
		}
		if m.Explanation != "" {
			attrs = append(attrs, slog.String("explanation", m.Explanation))
		}
	}
	t.log.LogAttrs(ctx, level, msg, attrs...)
}

func (t *Tracker) ignore(s *session, reason string, seq uint64, extra ...slog.Attr) {
	t.m.ignored.WithLabelValues(reason).Inc()
	attrs := append([]slog.Attr{slog.String("pod", s.identity.String()), slog.Uint64("session", s.id),
		slog.String("reason", reason), slog.Uint64("seq", seq)}, extra...)
	t.log.LogAttrs(context.Background(), slog.LevelDebug, "signal ignored", attrs...)
}

// prune forgets pods that have been disconnected, gone or stopping, and quiet
// since before cutoff, so pod churn does not grow the agent without bound.
// It returns the pods forgotten.
func (t *Tracker) prune(cutoff time.Time) []podsignal.PodID {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []podsignal.PodID
	for id, rec := range t.pods {
		st := rec.st.State
		if rec.st.Connected || !rec.lastActive.Before(cutoff) || (st != podsignal.Gone && st != podsignal.Stopping && st != "") {
			continue
		}
		if st != "" {
			t.m.pods.WithLabelValues(string(st)).Dec()
		}
		delete(t.pods, id)
		out = append(out, id)
	}
	return out
}

// shutdown stops recording wills and disconnects (the agent is going, not the
// pods) and closes every subscription.
func (t *Tracker) shutdown() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.closed = true
	close(t.done)
	for s := range t.subs {
		delete(t.subs, s)
		close(s.ch)
	}
}
