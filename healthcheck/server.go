package healthcheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/amf-edge/amf/podsignal"
)

// DefaultAddr is where the endpoint listens in a pod.
const DefaultAddr = ":8086"

// Server timeouts. The endpoint serves tiny requests to kubelet, Prometheus and
// the application beside it; anything slower is a stuck or hostile client.
const (
	readHeaderTimeout = 2 * time.Second
	readTimeout       = 5 * time.Second
	writeTimeout      = 10 * time.Second
	idleTimeout       = 60 * time.Second
	maxHeaderBytes    = 8 << 10
	shutdownTimeout   = 5 * time.Second
)

// Status is the sidecar's snapshot served by GET /status.
type Status struct {
	// State is the sidecar's current state.
	State podsignal.State `json:"state"`
	// Score is the latest model probability; nil before the first score.
	Score *float64 `json:"score"`
	// Threshold is the score at or above which the sample counts as anomalous.
	Threshold float64 `json:"threshold"`
	// Features are the latest model inputs; nil before the first sample.
	Features *podsignal.Features `json:"features"`
	// Explanation says what drove the latest score while it is anomalous
	// (model.Model.Why): the top three features, or predict_linear's time to
	// the limit.
	Explanation string `json:"explanation,omitempty"`
	// Model names the model in use, e.g. its manifest name and digest.
	Model string `json:"model"`
	// Seq is the sequence number of the latest sample.
	Seq uint64 `json:"seq"`
	// LastTransition is when State was entered, TransitionReason why.
	LastTransition   time.Time `json:"last_transition"`
	TransitionReason string    `json:"transition_reason"`
	// Probe is the latest app-logic probe result, if any.
	Probe *Result `json:"probe,omitempty"`
	// Target describes what the sidecar reads (container, how it was found,
	// cgroup); TargetError why it has no target now, or why the last search
	// for it failed.
	Target      string `json:"target,omitempty"`
	TargetError string `json:"target_error,omitempty"`
	// MemoryReference and CPUReference say what memory_percent and
	// cpu_percent are relative to; MemoryReference is nil until the target
	// has been read.
	MemoryReference *Reference `json:"memory_reference,omitempty"`
	CPUReference    *Reference `json:"cpu_reference,omitempty"`
	// Fenced says the node agent fenced the pod (cut off from the API server
	// and every guard) and the broker is held paused; Fence says what was
	// done about the latest command, or why it could not be.
	Fenced bool   `json:"fenced,omitempty"`
	Fence  string `json:"fence,omitempty"`
}

// Reference is what a percentage feature is relative to, and why.
type Reference struct {
	Value  float64 `json:"value"`
	Unit   string  `json:"unit"`   // "bytes" or "cores"
	Source string  `json:"source"` // a short name, also the source label of its metric
	Why    string  `json:"why"`
}

// ServerConfig configures a [Server]. Only Readiness is required; an endpoint
// whose source is nil answers 404.
type ServerConfig struct {
	// Addr is the listen address of ListenAndServe; default DefaultAddr.
	Addr string
	// Liveness backs GET /healthz: nil error means the sidecar is alive and its
	// sample loop turns (see Heartbeat). Nil means always alive.
	Liveness func() error
	// Readiness backs GET /readyz: nil error only while the app-logic probe
	// passes (see ProbeState); the error text is the 503's reason.
	Readiness func() error
	// Status returns the snapshot for GET /status.
	Status func() Status
	// Metrics are served on GET /metrics; refusals of POST /signal and failed
	// /status encodings are counted in them.
	Metrics *Metrics
	// OnAppReport receives every valid POST /signal report, with the request's
	// context. It may refuse it with ErrConflict (409) or ErrInvalidReport
	// (400); any other error is answered with 503.
	OnAppReport func(context.Context, AppReport) error
	// Logger receives refusals and server errors; nil discards them.
	Logger *slog.Logger
}

// Server is the sidecar's local HTTP endpoint.
type Server struct {
	cfg     ServerConfig
	log     *slog.Logger
	handler http.Handler
}

// NewServer validates cfg and returns a server.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Readiness == nil {
		return nil, errors.New("healthcheck: ServerConfig.Readiness is required: /readyz must not pass without a probe")
	}
	if cfg.Addr == "" {
		cfg.Addr = DefaultAddr
	}
	s := &Server{cfg: cfg, log: cfg.Logger}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	mux := http.NewServeMux()
	// Method-qualified patterns: the mux answers other methods with 405 and an
	// Allow header. GET patterns also serve HEAD.
	mux.HandleFunc("GET /healthz", s.check(cfg.Liveness))
	mux.HandleFunc("GET /readyz", s.check(cfg.Readiness))
	if cfg.Status != nil {
		mux.HandleFunc("GET /status", s.handleStatus)
	}
	if cfg.Metrics != nil {
		mux.Handle("GET /metrics", cfg.Metrics.Handler())
	}
	if cfg.OnAppReport != nil {
		mux.HandleFunc("POST /signal", s.handleSignal)
	}
	s.handler = mux
	return s, nil
}

// Handler returns the endpoint's handler, for tests and for callers that run
// their own http.Server.
func (s *Server) Handler() http.Handler { return s.handler }

// ListenAndServe listens on cfg.Addr and serves until ctx ends; see Serve.
func (s *Server) ListenAndServe(ctx context.Context) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("healthcheck: listen: %w", err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves on ln until ctx ends, then shuts down gracefully: in-flight
// requests get up to 5 s to finish. It returns nil after a clean shutdown, and
// closes ln in every case.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("healthcheck: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close() // the deadline passed: drop what is left
		<-errc
		return fmt.Errorf("healthcheck: shutdown: %w", err)
	}
	<-errc // http.ErrServerClosed
	return nil
}

// check answers a probe endpoint: 200 "ok" when fn passes, 503 with its reason
// otherwise. Probe answers must never be cached.
func (s *Server) check(fn func() error) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		var err error
		if fn != nil {
			err = fn()
		}
		if err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprintf(w, "%v\n", err)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	}
}

func (s *Server) handleStatus(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	// Encoded into a buffer first so that a failure (a NaN from the caller) is a
	// clean 500 rather than half a JSON document with a 200.
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(s.cfg.Status()); err != nil {
		s.countError(ErrorKindStatus)
		s.log.Error("encode /status", "err", err)
		http.Error(w, "status cannot be encoded", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(buf.Bytes())
}

func (s *Server) handleSignal(w http.ResponseWriter, r *http.Request) {
	// Only the application in the same pod (shared network namespace) may speak
	// for it; anything from outside the pod arrives from a non-loopback address.
	if !isLoopback(r.RemoteAddr) {
		s.refuse(w, r, http.StatusForbidden, "reports are accepted from loopback only")
		return
	}
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "application/json" {
		s.refuse(w, r, http.StatusUnsupportedMediaType, "Content-Type must be application/json")
		return
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		s.refuse(w, r, http.StatusUnsupportedMediaType, "charset must be utf-8")
		return
	}
	if r.ContentLength > MaxAppReportBytes {
		s.refuse(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("body larger than %d bytes", MaxAppReportBytes))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxAppReportBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			s.refuse(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("body larger than %d bytes", MaxAppReportBytes))
			return
		}
		s.refuse(w, r, http.StatusBadRequest, "reading body: "+err.Error())
		return
	}
	rep, err := parseAppReport(body)
	if err != nil {
		s.refuse(w, r, http.StatusBadRequest, err.Error())
		return
	}
	if err := s.cfg.OnAppReport(r.Context(), rep); err != nil {
		code := http.StatusServiceUnavailable
		switch {
		case errors.Is(err, ErrConflict):
			code = http.StatusConflict
		case errors.Is(err, ErrInvalidReport):
			code = http.StatusBadRequest
		}
		s.refuse(w, r, code, err.Error())
		return
	}
	s.log.Info("application health report accepted", "state", rep.State, "reason", rep.Reason)
	w.WriteHeader(http.StatusNoContent)
}

// refuse answers a POST /signal with an error, counts it and logs it with the
// peer: refused input is never silent.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, code int, msg string) {
	s.countError(ErrorKindAppReport)
	s.log.Warn("application health report refused", "status", code, "peer", r.RemoteAddr, "err", msg)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(struct {
		Error string `json:"error"`
	}{msg})
}

func (s *Server) countError(kind string) {
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.Error(kind)
	}
}

// isLoopback reports whether an http.Request.RemoteAddr is a loopback address,
// IPv4-mapped IPv6 included. Anything unparsable (a unix socket peer, say) is not.
func isLoopback(remoteAddr string) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}
