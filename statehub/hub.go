// Package statehub is the node agent's exchange of broker states: the
// sidecar of a stateful pod hands its broker's state in (Mosquitto's
// persistence file, whole, as the broker wrote it when it stopped), and the
// agent hands it on to the pod that takes over, whose sidecar fetches it and
// restarts its broker on it (DESIGN.md, "Broker state"). When the pair's
// pods run on two nodes, the primary's agent relays each state to the hub
// of the standby's node (Relay), which holds it for the handover there.
//
// A state is megabytes, so it does not go over the agent's MQTT broker,
// whose packets are bounded to kilobytes so that a flood cannot starve it:
// it goes over HTTP beside it, each request authenticated by the pod's own
// token, as the MQTT connection is. A pod may hand in only its own state
// and fetch only the state handed to it. The hub keeps states in memory,
// within a budget, for a short while: it is a relay, not a store.
package statehub

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/mosquittodb"
	"github.com/amf-edge/amf/podsignal"
)

// MaxStateBytes bounds one state: the sidecar holds a state in memory
// within its own limit (package handover).
const MaxStateBytes = 24 << 20

// Kind says when a state was written.
type Kind string

// The kinds of state.
const (
	// Final: written by the broker as it stopped; nothing happened in that
	// broker after it. A planned switchover hands this one on.
	Final Kind = contract.StateFinal
	// Snapshot: written on request while the broker served.
	Snapshot Kind = contract.StateSnapshot
)

// Authenticator turns a bearer token into the pod it proves (the agent's
// TokenReview). It must never put the token into an error or a log.
type Authenticator interface {
	Authenticate(ctx context.Context, token string) (podsignal.PodID, error)
}

// State is one state the hub holds.
type State struct {
	// ID names the state: "<namespace>/<pod>/<n>", n counting the states
	// this hub took in.
	ID   string
	From podsignal.PodID
	// Owner is From's Deployment, and Via the node whose agent relayed the
	// state, for a state relayed by another node's agent (a pair across
	// two nodes); both empty for one its pod handed in here.
	Owner, Via string
	Kind       Kind
	Summary    mosquittodb.Summary
	// At is when the hub took it in. Since is when it took in the first
	// state of From that it still holds a successor of: a pod's first,
	// unless its states expired meanwhile.
	At, Since time.Time
	Data      []byte
}

// Config configures a Hub. Zero values take the defaults noted.
type Config struct {
	// Authenticator proves who is asking. Required.
	Authenticator Authenticator
	// MaxBytes bounds every state held together; default MaxStateBytes,
	// which the agent DaemonSet's memory limit (64 Mi) holds beside its
	// own use. A state that does not fit evicts the oldest ones, never a
	// state handed to a pod that has not fetched it.
	MaxBytes int
	// TTL is how long a state is kept after it was taken in or handed on;
	// default 2 min: a handover that takes longer has been given up.
	TTL time.Duration
	// Wait bounds one long poll of GET; default 25 s.
	Wait time.Duration
	// Logger gets one line per state taken in, handed on or fetched.
	Logger *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Registerer receives the hub's metrics (amf_statehub_*); nil: not registered.
	Registerer prometheus.Registerer
	// Peers proves that a relay comes from another node's agent; nil: the
	// hub takes no relayed state (RelayPrefix answers 404).
	Peers PeerAuthenticator
}

// Hub holds the states handed in and those handed on. Create it with New.
type Hub struct {
	cfg Config
	log *slog.Logger
	now func() time.Time
	m   *metrics

	mu       sync.Mutex
	seq      uint64
	in       map[podsignal.PodID]*State // the newest state each pod handed in
	out      map[podsignal.PodID]*State // the state handed on to each pod
	bytes    int
	changed  chan struct{} // closed and replaced when out changes, for long polls
	received chan State    // states taken in, for the agent; newest kept when full
}

// Validate says what is wrong with c, if anything. It is the one check of
// c's values: New makes it, and the agent calls it before it starts
// anything. A zero value that takes a default is valid.
func (c Config) Validate() error {
	if c.Authenticator == nil {
		return errors.New("statehub: Config.Authenticator is required")
	}
	if c.MaxBytes > 0 && c.MaxBytes < MaxStateBytes {
		return fmt.Errorf("statehub: a budget of %d bytes is below one state's bound (%d bytes): MaxBytes must be at least that, or 0 for the default", c.MaxBytes, MaxStateBytes)
	}
	return nil
}

// New checks cfg (Validate) and returns a Hub.
func New(cfg Config) (*Hub, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = MaxStateBytes
	}
	if cfg.TTL <= 0 {
		cfg.TTL = 2 * time.Minute
	}
	if cfg.Wait <= 0 {
		cfg.Wait = 25 * time.Second
	}
	h := &Hub{cfg: cfg, log: cfg.Logger, now: cfg.Now, in: map[podsignal.PodID]*State{}, out: map[podsignal.PodID]*State{},
		changed: make(chan struct{}), received: make(chan State, 16), m: newMetrics(cfg.Registerer)}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.now == nil {
		h.now = time.Now
	}
	return h, nil
}

// Received delivers each state taken in, without its data (Take has it).
// A consumer that falls behind loses the oldest notices, never a state.
func (h *Hub) Received() <-chan State { return h.received }

// ErrNoState means the hub holds no state of that pod.
var ErrNoState = errors.New("statehub: no state held")

// put takes in a state handed in by from.
func (h *Hub) put(from podsignal.PodID, owner, via string, kind Kind, sum mosquittodb.Summary, data []byte) (State, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.expire()
	since := h.now()
	if old := h.in[from]; old != nil {
		h.bytes -= len(old.Data)
		since = old.Since
		delete(h.in, from)
	}
	if !h.makeRoom(len(data)) {
		return State{}, fmt.Errorf("statehub: %d bytes do not fit beside the states handed on and not fetched yet (budget %d bytes)", len(data), h.cfg.MaxBytes)
	}
	h.seq++
	s := &State{ID: from.String() + "/" + strconv.FormatUint(h.seq, 10), From: from, Owner: owner, Via: via, Kind: kind, Summary: sum, At: h.now(), Since: since, Data: data}
	if via != "" {
		// Numbered by this hub too, so that the sending hub's numbers
		// (its own sequence) cannot collide with this one's.
		s.ID += "@" + via
	}
	h.in[from] = s
	h.bytes += len(data)
	h.m.bytes.Set(float64(h.bytes))
	notice := *s
	notice.Data = nil
	for {
		select {
		case h.received <- notice:
			return notice, nil
		default:
		}
		select { // full: the oldest notice goes
		case <-h.received:
		default:
		}
	}
}

// makeRoom evicts the oldest states handed in until n more bytes fit;
// states handed on are never evicted. Called with mu held.
func (h *Hub) makeRoom(n int) bool {
	for h.bytes+n > h.cfg.MaxBytes {
		var oldest *State
		for _, s := range h.in {
			if oldest == nil || s.At.Before(oldest.At) {
				oldest = s
			}
		}
		if oldest == nil {
			return false
		}
		h.log.Warn("broker state dropped for room", slog.String("state", oldest.ID), slog.Int("bytes", len(oldest.Data)))
		delete(h.in, oldest.From)
		h.bytes -= len(oldest.Data)
	}
	return true
}

// expire drops the states older than the TTL. Called with mu held.
func (h *Hub) expire() {
	cut := h.now().Add(-h.cfg.TTL)
	for id, s := range h.in {
		if s.At.Before(cut) {
			delete(h.in, id)
			h.bytes -= len(s.Data)
		}
	}
	for id, s := range h.out {
		if s.At.Before(cut) {
			h.log.Warn("broker state handed on but not fetched in time: dropped", slog.String("state", s.ID), slog.String("to", id.String()))
			delete(h.out, id)
			h.bytes -= len(s.Data)
		}
	}
	h.m.bytes.Set(float64(h.bytes))
}

// HandOn hands the newest state that from handed in (its ID must be id, so
// that a newer one is never handed on in its place) on to the pod to, whose
// sidecar fetches it. It returns the state, without its data.
func (h *Hub) HandOn(id string, from, to podsignal.PodID) (State, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.expire()
	s := h.in[from]
	if s == nil || s.ID != id {
		return State{}, fmt.Errorf("%w: %s from %s (expired after %v, or replaced)", ErrNoState, id, from, h.cfg.TTL)
	}
	delete(h.in, from)
	if old := h.out[to]; old != nil {
		h.bytes -= len(old.Data)
	}
	s.At = h.now() // the TTL counts from the handing on
	h.out[to] = s
	h.m.handed.Inc()
	h.m.bytes.Set(float64(h.bytes))
	close(h.changed)
	h.changed = make(chan struct{})
	h.log.Info("broker state handed on", slog.String("state", s.ID), slog.String("to", to.String()), slog.Int("bytes", len(s.Data)))
	notice := *s
	notice.Data = nil
	return notice, nil
}

// Latest returns the newest state that from handed in and the hub still
// holds, without its data.
func (h *Hub) Latest(from podsignal.PodID) (State, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.expire()
	s := h.in[from]
	if s == nil {
		return State{}, false
	}
	notice := *s
	notice.Data = nil
	return notice, true
}

// LatestOwned returns the newest state relayed here from a pod of
// Deployment owner in namespace ns, without its data; only from a pod
// whose states the hub held by heldBy (Since), if that is not zero: a
// failover takes the retired primary's state, never that of a pod of the
// same Deployment that came after it (its comeback as the standby); and
// only of kind, if that is not "": a switchover takes the retired
// primary's final state, never a newer snapshot of that comeback.
func (h *Hub) LatestOwned(ns, owner string, heldBy time.Time, kind Kind) (State, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.expire()
	var best *State
	for _, s := range h.in {
		if !heldBy.IsZero() && s.Since.After(heldBy) || kind != "" && s.Kind != kind {
			continue
		}
		if s.Owner == owner && s.From.Namespace == ns && (best == nil || s.At.After(best.At)) {
			best = s
		}
	}
	if best == nil {
		return State{}, false
	}
	notice := *best
	notice.Data = nil
	return notice, true
}

// Copy returns the state id that from handed in, with its data (which
// nobody writes to: it may be read while the hub drops it).
func (h *Hub) Copy(from podsignal.PodID, id string) (State, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.in[from]
	if s == nil || s.ID != id {
		return State{}, false
	}
	return *s, true
}

// Done drops the state handed on to pod to once its broker runs on it (or
// the handover was given up), so a sidecar that starts again later cannot
// fetch it a second time over what its broker did since.
func (h *Hub) Done(to podsignal.PodID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s := h.out[to]; s != nil {
		delete(h.out, to)
		h.bytes -= len(s.Data)
	}
	h.m.bytes.Set(float64(h.bytes))
}

// await returns the state handed on to pod, other than the one named
// have (which the pod holds already), waiting until ctx ends.
func (h *Hub) await(ctx context.Context, pod podsignal.PodID, have string) (*State, bool) {
	for {
		h.mu.Lock()
		h.expire()
		s, changed := h.out[pod], h.changed
		h.mu.Unlock()
		if s != nil && (have == "" || s.ID != have) {
			return s, true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, false
		}
	}
}
