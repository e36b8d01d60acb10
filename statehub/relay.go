package statehub

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/amf-edge/amf/contract"
	"github.com/amf-edge/amf/podsignal"
)

// A pair across two nodes (DESIGN.md, "Broker state"): the primary's pod
// hands its states in to its own node's agent, which relays each to the
// hub of the standby's node, so that the standby's agent holds them when
// the switchover or the failover comes, even one that takes the primary's
// node with it (a power cut).
//
//	PUT /v1/relay/<namespace>/<pod>   another node's agent relays a state of
//	                                  pod (header Kind-Header, OwnerHeader:
//	                                  the pod's Deployment)
//
// It needs "Authorization: Bearer <the agent's token>" for
// contract.StatePeerAudience, which Config.Peers proves.
const (
	RelayPrefix = "/v1/relay/"
	// OwnerHeader names the Deployment of a relayed state's pod.
	OwnerHeader = "Amf-State-Owner"
)

// PeerAuthenticator proves that a bearer token is another node's agent's
// and returns that node. It must never put the token into an error or a
// log.
type PeerAuthenticator interface {
	AuthenticatePeer(ctx context.Context, token string) (node string, err error)
}

func (h *Hub) serveRelay(w http.ResponseWriter, r *http.Request) {
	const op = "relay_in"
	if h.cfg.Peers == nil {
		http.Error(w, "statehub: this hub takes no relayed state (the agent runs without a peer token)", http.StatusNotFound)
		return
	}
	rest, _ := strings.CutPrefix(r.URL.Path, RelayPrefix)
	pod, err := parsePath(PathPrefix + rest)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	if r.Method != http.MethodPut {
		w.Header().Set("Allow", "PUT")
		http.Error(w, "statehub: PUT", http.StatusMethodNotAllowed)
		return
	}
	token, ok := bearer(r)
	if !ok {
		h.m.requests.WithLabelValues(op, outcomeUnauthorized).Inc()
		http.Error(w, "statehub: a bearer token of an agent is required", http.StatusUnauthorized)
		return
	}
	via, err := h.cfg.Peers.AuthenticatePeer(r.Context(), token)
	if err != nil {
		h.m.requests.WithLabelValues(op, outcomeUnauthorized).Inc()
		h.log.Warn("relayed broker state refused", slog.String("pod", pod.String()), slog.String("error", err.Error()))
		http.Error(w, "statehub: token not accepted", http.StatusUnauthorized)
		return
	}
	owner := r.Header.Get(OwnerHeader)
	if err := podsignal.ValidateNames(pod.Namespace, owner); err != nil {
		h.m.requests.WithLabelValues(op, outcomeRefused).Inc()
		http.Error(w, fmt.Sprintf("statehub: header %s: %v", OwnerHeader, err), http.StatusBadRequest)
		return
	}
	h.takeIn(w, r, op, pod, owner, via)
}

// RelayConfig configures a Relay.
type RelayConfig struct {
	// TokenFile is the agent's projected token for
	// contract.StatePeerAudience, read at every send (the kubelet rotates
	// it). Required.
	TokenFile string
	// HTTP is the client; default one with a 30 s timeout (a state is at
	// most 24 MiB, on a LAN).
	HTTP *http.Client
	// Retry is the pause before a failed relay is tried again; default 1 s.
	// A relay is tried until a newer state of the same pod replaces it, or
	// for TTL.
	Retry time.Duration
	// TTL bounds the tries of one state; default 2 min, the hubs' own.
	TTL    time.Duration
	Logger *slog.Logger
	Now    func() time.Time
}

// Relay sends the states handed in here on to the hub of another node,
// one at a time, the newest of each pod only: a snapshot that waits behind
// a slow peer is replaced by the next, never queued behind it.
type Relay struct {
	cfg RelayConfig
	log *slog.Logger
	m   *metrics

	mu      sync.Mutex
	pending map[podsignal.PodID]relayJob
	wake    chan struct{}
}

type relayJob struct {
	hub   string // the peer hub's URL
	st    State  // with its data
	since time.Time
	next  time.Time // not tried before
}

// NewRelay returns a Relay, which sends once Run runs. It counts in h's
// metrics (amf_statehub_requests_total{op="relay_out"}).
func NewRelay(h *Hub, cfg RelayConfig) (*Relay, error) {
	if cfg.TokenFile == "" {
		return nil, errors.New("statehub: RelayConfig.TokenFile is required (the agent's token for " + contract.StatePeerAudience + ")")
	}
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Timeout: 30 * time.Second}
	}
	if cfg.Retry <= 0 {
		cfg.Retry = time.Second
	}
	if cfg.TTL <= 0 {
		cfg.TTL = 2 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	r := &Relay{cfg: cfg, log: cfg.Logger, m: h.m, pending: map[podsignal.PodID]relayJob{}, wake: make(chan struct{}, 1)}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	return r, nil
}

// Forward relays st (with its data, from Hub.Copy) to the hub at hubURL,
// replacing any state of the same pod not sent yet.
func (r *Relay) Forward(hubURL string, st State) {
	now := r.cfg.Now()
	r.mu.Lock()
	r.pending[st.From] = relayJob{hub: hubURL, st: st, since: now, next: now}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Run sends until ctx ends.
func (r *Relay) Run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		job, ok, wait := r.nextJob()
		if ok {
			err := r.send(ctx, job)
			r.done(job, err)
			continue
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake:
		case <-timer.C:
		}
	}
}

// nextJob returns a job due now, or how long until one is.
func (r *Relay) nextJob() (relayJob, bool, time.Duration) {
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	wait := time.Hour
	for pod, j := range r.pending {
		if now.Sub(j.since) > r.cfg.TTL {
			r.log.Warn("broker state not relayed: given up", slog.String("state", j.st.ID), slog.String("to", j.hub), slog.Duration("tried_for", r.cfg.TTL))
			delete(r.pending, pod)
			continue
		}
		if !j.next.After(now) {
			return j, true, 0
		}
		wait = min(wait, j.next.Sub(now))
	}
	return relayJob{}, false, wait
}

// done removes a sent job, or has a failed one tried again, unless a newer
// state of its pod came meanwhile.
func (r *Relay) done(j relayJob, err error) {
	outcome := outcomeOK
	if err != nil {
		outcome = "failed"
	}
	r.m.requests.WithLabelValues("relay_out", outcome).Inc()
	r.mu.Lock()
	defer r.mu.Unlock()
	cur, ok := r.pending[j.st.From]
	if !ok || cur.st.ID != j.st.ID || cur.hub != j.hub {
		return
	}
	if err == nil {
		delete(r.pending, j.st.From)
		r.log.Info("broker state relayed", slog.String("state", j.st.ID), slog.String("kind", string(j.st.Kind)), slog.String("to", j.hub),
			slog.Int("bytes", len(j.st.Data)), slog.Duration("after", r.cfg.Now().Sub(j.since)))
		return
	}
	r.log.Warn("broker state not relayed: trying again", slog.String("state", j.st.ID), slog.String("to", j.hub), slog.String("error", err.Error()))
	cur.next = r.cfg.Now().Add(r.cfg.Retry)
	r.pending[j.st.From] = cur
}

func (r *Relay) send(ctx context.Context, j relayJob) error {
	b, err := os.ReadFile(r.cfg.TokenFile)
	if err != nil {
		return fmt.Errorf("statehub: peer token: %w", err)
	}
	u := strings.TrimSuffix(j.hub, "/") + RelayPrefix + j.st.From.Namespace + "/" + j.st.From.Pod
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, bytes.NewReader(j.st.Data))
	if err != nil {
		return fmt.Errorf("statehub: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(b)))
	req.Header.Set(KindHeader, string(j.st.Kind))
	req.Header.Set(OwnerHeader, j.st.Owner)
	resp, err := r.cfg.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusNoContent {
		return refusal(resp)
	}
	return nil
}
