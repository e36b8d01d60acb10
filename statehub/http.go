package statehub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/amf-edge/amf/mosquittodb"
	"github.com/amf-edge/amf/podsignal"
)

// The HTTP side of the hub: one path per pod.
//
//	PUT /v1/state/<namespace>/<pod>   the pod's sidecar hands its state in
//	                                  (header Kind-Header: final or snapshot)
//	GET /v1/state/<namespace>/<pod>   the pod's sidecar fetches the state
//	                                  handed on to it: 200 with it, or 204
//	                                  when none came within the long poll;
//	                                  ?have=<id> waits past the state it
//	                                  holds already
//
// Both need "Authorization: Bearer <the pod's token>".
const (
	PathPrefix = "/v1/state/"
	// KindHeader says which Kind a PUT carries.
	KindHeader = "Amf-State-Kind"
	// IDHeader names the state a GET returns (State.ID).
	IDHeader = "Amf-State-Id"
	// FromHeader names the pod a GET's state came from.
	FromHeader = "Amf-State-From"
)

// Handler serves the hub's HTTP side: the pods' paths and the peers'.
func (h *Hub) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(PathPrefix, h.serve)
	mux.HandleFunc(RelayPrefix, h.serveRelay)
	return mux
}

func (h *Hub) serve(w http.ResponseWriter, r *http.Request) {
	pod, err := parsePath(r.URL.Path)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	if r.Method != http.MethodPut && r.Method != http.MethodGet {
		w.Header().Set("Allow", "GET, PUT")
		http.Error(w, "statehub: GET or PUT", http.StatusMethodNotAllowed)
		return
	}
	op := "fetch"
	if r.Method == http.MethodPut {
		op = "hand_in"
	}
	token, ok := bearer(r)
	if !ok {
		h.m.requests.WithLabelValues(op, outcomeUnauthorized).Inc()
		http.Error(w, "statehub: a bearer token of the pod is required", http.StatusUnauthorized)
		return
	}
	id, err := h.cfg.Authenticator.Authenticate(r.Context(), token)
	if err != nil {
		h.m.requests.WithLabelValues(op, outcomeUnauthorized).Inc()
		h.log.Warn("broker state request refused", slog.String("pod", pod.String()), slog.String("error", err.Error()))
		http.Error(w, "statehub: token not accepted", http.StatusUnauthorized)
		return
	}
	if id != pod {
		h.m.requests.WithLabelValues(op, outcomeForbidden).Inc()
		h.log.Warn("broker state request for another pod refused", slog.String("pod", id.String()), slog.String("path", pod.String()))
		http.Error(w, fmt.Sprintf("statehub: %s may not use the state of %s", id, pod), http.StatusForbidden)
		return
	}
	if r.Method == http.MethodPut {
		h.serveHandIn(w, r, pod)
		return
	}
	h.serveFetch(w, r, pod)
}

func (h *Hub) serveHandIn(w http.ResponseWriter, r *http.Request, pod podsignal.PodID) {
	h.takeIn(w, r, "hand_in", pod, "", "")
}

// takeIn reads a state of pod from r, checks it whole, and keeps it: handed
// in by the pod itself (owner and via empty) or relayed by the agent of
// node via (serveRelay). op labels the metrics.
func (h *Hub) takeIn(w http.ResponseWriter, r *http.Request, op string, pod podsignal.PodID, owner, via string) {
	refused := h.m.requests.WithLabelValues(op, outcomeRefused)
	kind := Kind(r.Header.Get(KindHeader))
	if kind != Final && kind != Snapshot {
		refused.Inc()
		http.Error(w, fmt.Sprintf("statehub: header %s must be %q or %q", KindHeader, Final, Snapshot), http.StatusBadRequest)
		return
	}
	data, err := readBody(w, r)
	if err != nil {
		refused.Inc()
		if errors.As(err, new(*http.MaxBytesError)) {
			http.Error(w, fmt.Sprintf("statehub: a state is at most %d bytes", MaxStateBytes), http.StatusRequestEntityTooLarge)
			return
		}
		http.Error(w, "statehub: body: "+err.Error(), http.StatusBadRequest)
		return
	}
	// Checked whole, also when relayed: a hub trusts no state it has not read.
	sum, err := mosquittodb.Read(data)
	if err == nil && kind == Final && !sum.Shutdown {
		err = errors.New("a final state must be the file written as the broker stopped (its shutdown flag is not set)")
	}
	if err != nil {
		refused.Inc()
		h.log.Warn("broker state refused", slog.String("pod", pod.String()), slog.String("via", via), slog.Int("bytes", len(data)), slog.String("error", err.Error()))
		http.Error(w, "statehub: state refused: "+err.Error(), http.StatusUnprocessableEntity)
		return
	}
	s, err := h.put(pod, owner, via, kind, sum, data)
	if err != nil {
		h.m.requests.WithLabelValues(op, outcomeNoRoom).Inc()
		http.Error(w, err.Error(), http.StatusInsufficientStorage)
		return
	}
	msg := "broker state taken in"
	if via != "" {
		msg = "broker state relayed in"
	}
	h.log.Info(msg, slog.String("state", s.ID), slog.String("kind", string(kind)), slog.String("via", via), slog.String("owner", owner),
		slog.Int("bytes", len(data)), slog.Int("retained", sum.Retained), slog.Int("sessions", len(sum.Sessions)), slog.Int("queued", sum.Queued))
	h.m.requests.WithLabelValues(op, outcomeOK).Inc()
	w.Header().Set(IDHeader, s.ID)
	w.WriteHeader(http.StatusNoContent)
}

func (h *Hub) serveFetch(w http.ResponseWriter, r *http.Request, pod podsignal.PodID) {
	wait := h.cfg.Wait
	if v := r.URL.Query().Get("wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			http.Error(w, fmt.Sprintf("statehub: wait %q is not a duration", v), http.StatusBadRequest)
			return
		}
		wait = min(d, h.cfg.Wait)
	}
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	s, ok := h.await(ctx, pod, r.URL.Query().Get("have"))
	if !ok {
		h.m.requests.WithLabelValues("fetch", outcomeEmpty).Inc()
		w.WriteHeader(http.StatusNoContent)
		return
	}
	h.m.requests.WithLabelValues("fetch", outcomeOK).Inc()
	w.Header().Set(IDHeader, s.ID)
	w.Header().Set(FromHeader, s.From.String())
	w.Header().Set(KindHeader, string(s.Kind))
	w.Header().Set("Content-Type", "application/octet-stream")
	if _, err := w.Write(s.Data); err != nil {
		h.log.Warn("broker state not delivered", slog.String("state", s.ID), slog.String("to", pod.String()), slog.String("error", err.Error()))
		return
	}
	h.log.Info("broker state fetched", slog.String("state", s.ID), slog.String("to", pod.String()))
}

// bearer returns the request's bearer token, if it has one.
func bearer(r *http.Request) (string, bool) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return token, ok && token != ""
}

// readBody reads a state of at most MaxStateBytes into a buffer of its
// size when the request says it (the agent's memory is small: a growing
// buffer would take up to twice the state).
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body := http.MaxBytesReader(w, r.Body, MaxStateBytes)
	if n := r.ContentLength; n > 0 && n <= MaxStateBytes {
		data := make([]byte, n)
		if _, err := io.ReadFull(body, data); err != nil {
			return nil, err
		}
		return data, nil
	}
	return io.ReadAll(body)
}

// parsePath returns the pod of PathPrefix<namespace>/<pod>.
func parsePath(p string) (podsignal.PodID, error) {
	rest, ok := strings.CutPrefix(p, PathPrefix)
	parts := strings.Split(rest, "/")
	if !ok || len(parts) != 2 {
		return podsignal.PodID{}, fmt.Errorf("statehub: path must be %s<namespace>/<pod>", PathPrefix)
	}
	if err := podsignal.ValidateNames(parts[0], parts[1]); err != nil {
		return podsignal.PodID{}, fmt.Errorf("statehub: %w", err)
	}
	return podsignal.PodID{Namespace: parts[0], Pod: parts[1]}, nil
}
