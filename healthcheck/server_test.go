package healthcheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/amf-edge/amf/podsignal"
)

// fixture is a server over fakes the tests can steer.
type fixture struct {
	srv      *Server
	metrics  *Metrics
	probe    *ProbeState
	alive    error
	status   Status
	reportFn func(AppReport) error

	mu      sync.Mutex // the callback runs on the server's goroutines
	reports []AppReport
}

func (f *fixture) received() []AppReport {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]AppReport(nil), f.reports...)
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	score, cpu := 0.73, 55.5
	f := &fixture{
		metrics: NewMetrics(),
		probe:   NewProbeState(0),
		status: Status{
			State: podsignal.Anomalous, Score: &score, Threshold: 0.5,
			Features: &podsignal.Features{CPUPercent: &cpu},
			Model:    "default@sha256:0123", Seq: 17,
			LastTransition:   time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
			TransitionReason: "score 0.73 ≥ 0.5",
		},
	}
	srv, err := NewServer(ServerConfig{
		Liveness:  func() error { return f.alive },
		Readiness: f.probe.Check,
		Status:    func() Status { return f.status },
		Metrics:   f.metrics,
		OnAppReport: func(_ context.Context, r AppReport) error {
			f.mu.Lock()
			f.reports = append(f.reports, r)
			f.mu.Unlock()
			if f.reportFn != nil {
				return f.reportFn(r)
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	f.srv = srv
	return f
}

func (f *fixture) do(req *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(w, req)
	return w
}

func TestProbeEndpoints(t *testing.T) {
	for _, tc := range []struct {
		name     string
		path     string
		setup    func(*fixture)
		wantCode int
		wantBody string
	}{
		{"alive", "/healthz", nil, 200, "ok"},
		{"stuck", "/healthz", func(f *fixture) { f.alive = errors.New("loop stuck: last beat 9s ago") }, 503, "loop stuck"},
		{"no probe yet", "/readyz", nil, 503, "no probe result yet"},
		{"probe failing", "/readyz", func(f *fixture) { f.probe.Report(Result{Reason: "connection lost: EOF"}) }, 503, "connection lost: EOF"},
		{"probe passing", "/readyz", func(f *fixture) { f.probe.Report(Result{OK: true, RTT: time.Millisecond}) }, 200, "ok"},
		{"unknown path", "/nope", nil, 404, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			if tc.setup != nil {
				tc.setup(f)
			}
			w := f.do(httptest.NewRequest("GET", tc.path, nil))
			if w.Code != tc.wantCode || !strings.Contains(w.Body.String(), tc.wantBody) {
				t.Fatalf("GET %s = %d %q, want %d containing %q", tc.path, w.Code, w.Body, tc.wantCode, tc.wantBody)
			}
			if tc.wantCode != 404 && w.Header().Get("Cache-Control") != "no-store" {
				t.Errorf("Cache-Control = %q", w.Header().Get("Cache-Control"))
			}
		})
	}
}

func TestMethodNotAllowed(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct{ method, path, allow string }{
		{"POST", "/healthz", "GET, HEAD"},
		{"DELETE", "/status", "GET, HEAD"},
		{"GET", "/signal", "POST"},
	} {
		w := f.do(httptest.NewRequest(tc.method, tc.path, nil))
		if w.Code != 405 || w.Header().Get("Allow") != tc.allow {
			t.Errorf("%s %s = %d Allow %q, want 405 Allow %q", tc.method, tc.path, w.Code, w.Header().Get("Allow"), tc.allow)
		}
	}
}

func TestStatus(t *testing.T) {
	f := newFixture(t)
	w := f.do(httptest.NewRequest("GET", "/status", nil))
	if w.Code != 200 || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("GET /status = %d %s", w.Code, w.Header().Get("Content-Type"))
	}
	var got Status
	dec := json.NewDecoder(w.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatal(err)
	}
	if got.State != podsignal.Anomalous || *got.Score != 0.73 || *got.Features.CPUPercent != 55.5 ||
		got.Features.MemoryPercent != nil || got.Model != f.status.Model || got.Seq != 17 ||
		!got.LastTransition.Equal(f.status.LastTransition) || got.TransitionReason != f.status.TransitionReason {
		t.Fatalf("status round trip: got %+v", got)
	}

	// A snapshot JSON cannot carry is a clean 500, counted.
	nan := math.NaN()
	f.status.Score = &nan
	w = f.do(httptest.NewRequest("GET", "/status", nil))
	if w.Code != 500 {
		t.Fatalf("NaN score: %d %q, want 500", w.Code, w.Body)
	}
	if n := testutil.ToFloat64(f.metrics.errors.WithLabelValues(ErrorKindStatus)); n != 1 {
		t.Fatalf("status errors = %v, want 1", n)
	}
}

func TestMetricsEndpoint(t *testing.T) {
	f := newFixture(t)
	m := f.metrics
	cpu, mem := 91.0, 30.5
	m.SetScore(0.83)
	m.SetFeatures(&podsignal.Features{CPUPercent: &cpu, MemoryPercent: &mem})
	m.SetState(podsignal.Anomalous)
	m.ObserveSample(2 * time.Millisecond)
	m.ObserveProbe(Result{OK: true, RTT: 500 * time.Microsecond})
	m.ObserveProbe(Result{OK: true, RTT: 700 * time.Microsecond})
	m.SignalSent(podsignal.Anomalous)
	m.SignalSent(podsignal.Anomalous)
	m.Error("cgroup_read")

	w := f.do(httptest.NewRequest("GET", "/metrics", nil))
	if w.Code != 200 {
		t.Fatalf("GET /metrics = %d", w.Code)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(w.Body)
	if err != nil {
		t.Fatalf("parse exposition: %v", err)
	}
	value := func(name string, labels ...string) float64 {
		t.Helper()
		fam, ok := fams[name]
		if !ok {
			t.Fatalf("metric %s missing", name)
		}
	next:
		for _, mt := range fam.GetMetric() {
			for i := 0; i < len(labels); i += 2 {
				if labelValue(mt, labels[i]) != labels[i+1] {
					continue next
				}
			}
			switch {
			case mt.Gauge != nil:
				return mt.Gauge.GetValue()
			case mt.Counter != nil:
				return mt.Counter.GetValue()
			case mt.Histogram != nil:
				return float64(mt.Histogram.GetSampleCount())
			}
		}
		t.Fatalf("metric %s%v missing", name, labels)
		return 0
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"amf_anomaly_score", nil, 0.83},
		{"amf_feature", []string{"feature", "cpu_percent"}, 91},
		{"amf_feature", []string{"feature", "memory_percent"}, 30.5},
		{"amf_state", []string{"state", "anomalous"}, 1},
		{"amf_state", []string{"state", "healthy"}, 0},
		{"amf_sample_duration_seconds", nil, 1},
		{"amf_probe_rtt_seconds", nil, 2},
		{"amf_probe_up", nil, 1},
		{"amf_signals_sent_total", []string{"state", "anomalous"}, 2},
		{"amf_signals_sent_total", []string{"state", "gone"}, 0},
		{"amf_errors_total", []string{"kind", "cgroup_read"}, 1},
		{"amf_errors_total", []string{"kind", "app_report"}, 0},
	} {
		if got := value(c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if n := len(fams["amf_feature"].GetMetric()); n != 2 {
		t.Errorf("%d feature series, want 2: undefined features must be absent", n)
	}
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes"} {
		if _, ok := fams[name]; !ok {
			t.Errorf("%s missing: runtime and process collectors not registered", name)
		}
	}
}

func labelValue(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func TestSignalEndpoint(t *testing.T) {
	const loopback = "127.0.0.1:40000"
	valid := `{"state":"unhealthy","reason":"message store full"}`
	errBusy := errors.New("state machine busy")
	for _, tc := range []struct {
		name        string
		remote      string
		contentType string
		body        string
		chunked     bool // no Content-Length: only the body reader can enforce the cap
		verdict     error
		wantCode    int
		wantErr     string
		wantReport  *AppReport
	}{
		{name: "unhealthy", body: valid, wantCode: 204,
			wantReport: &AppReport{State: podsignal.Unhealthy, Reason: "message store full"}},
		{name: "healthy without reason", body: `{"state":"healthy"}`, wantCode: 204,
			wantReport: &AppReport{State: podsignal.Healthy}},
		{name: "ipv6 loopback", remote: "[::1]:40000", body: valid, wantCode: 204},
		{name: "ipv4-mapped loopback", remote: "[::ffff:127.0.0.1]:40000", body: valid, wantCode: 204},
		{name: "other loopback address", remote: "127.1.2.3:40000", body: valid, wantCode: 204},
		{name: "charset utf-8", contentType: "application/json; charset=UTF-8", body: valid, wantCode: 204},
		{name: "unicode reason", body: `{"state":"unhealthy","reason":"Überlast ✗"}`, wantCode: 204},

		{name: "from another pod", remote: "10.1.2.3:40000", body: valid, wantCode: 403, wantErr: "loopback"},
		{name: "from the node, ipv6", remote: "[fd00::1]:40000", body: valid, wantCode: 403, wantErr: "loopback"},
		{name: "unparsable peer", remote: "@", body: valid, wantCode: 403, wantErr: "loopback"},
		{name: "no content type", contentType: "-", body: valid, wantCode: 415},
		{name: "text/plain", contentType: "text/plain", body: valid, wantCode: 415},
		{name: "other charset", contentType: "application/json; charset=latin1", body: valid, wantCode: 415},
		{name: "too large", body: `{"state":"healthy","reason":"` + strings.Repeat("a", 1100) + `"}`, wantCode: 413},
		{name: "too large chunked", chunked: true, body: strings.Repeat(" ", 1100) + valid, wantCode: 413},
		{name: "unknown field", body: `{"state":"healthy","probability":0.1}`, wantCode: 400, wantErr: "unknown field"},
		{name: "key case differs", body: `{"State":"healthy"}`, wantCode: 400, wantErr: "unknown field"},
		{name: "duplicate field", body: `{"state":"healthy","state":"unhealthy"}`, wantCode: 400, wantErr: "duplicate"},
		{name: "missing state", body: `{"reason":"x"}`, wantCode: 400, wantErr: "missing field"},
		{name: "null state", body: `{"state":null}`, wantCode: 400, wantErr: "must be a string"},
		{name: "number state", body: `{"state":1}`, wantCode: 400, wantErr: "must be a string"},
		{name: "state not for apps", body: `{"state":"anomalous"}`, wantCode: 400, wantErr: "may report only"},
		{name: "gone", body: `{"state":"gone"}`, wantCode: 400, wantErr: "may report only"},
		{name: "unknown state", body: `{"state":"fine"}`, wantCode: 400, wantErr: "may report only"},
		{name: "reason too long", body: `{"state":"unhealthy","reason":"` + strings.Repeat("x", podsignal.MaxReasonBytes+1) + `"}`, wantCode: 400, wantErr: "reason of 513 bytes"},
		{name: "control character", body: `{"state":"unhealthy","reason":"bell\u0007"}`, wantCode: 400, wantErr: "printable"},
		{name: "invalid utf-8", body: "{\"state\":\"unhealthy\",\"reason\":\"\xff\"}", wantCode: 400, wantErr: "UTF-8"},
		{name: "trailing data", body: valid + `{}`, wantCode: 400, wantErr: "trailing"},
		{name: "array", body: `[]`, wantCode: 400, wantErr: "JSON object"},
		{name: "empty", body: ``, wantCode: 400, wantErr: "JSON object"},
		{name: "truncated", body: `{"state":"healthy"`, wantCode: 400},

		{name: "rejected: conflict", body: valid, verdict: fmt.Errorf("sidecar is stopping: %w", ErrConflict), wantCode: 409, wantErr: "stopping"},
		{name: "rejected: invalid", body: valid, verdict: fmt.Errorf("no such transition: %w", ErrInvalidReport), wantCode: 400, wantErr: "no such transition"},
		{name: "rejected: other", body: valid, verdict: errBusy, wantCode: 503, wantErr: "busy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.reportFn = func(AppReport) error { return tc.verdict }
			var body io.Reader = strings.NewReader(tc.body)
			if tc.chunked {
				body = io.MultiReader(body) // hides the length from NewRequest
			}
			req := httptest.NewRequest("POST", "/signal", body)
			req.RemoteAddr = loopback
			if tc.remote != "" {
				req.RemoteAddr = tc.remote
			}
			switch tc.contentType {
			case "":
				req.Header.Set("Content-Type", "application/json")
			case "-":
			default:
				req.Header.Set("Content-Type", tc.contentType)
			}
			w := f.do(req)
			if w.Code != tc.wantCode {
				t.Fatalf("status %d %q, want %d", w.Code, w.Body, tc.wantCode)
			}
			refusals := testutil.ToFloat64(f.metrics.errors.WithLabelValues(ErrorKindAppReport))
			if tc.wantCode == 204 {
				if refusals != 0 || len(f.reports) != 1 {
					t.Fatalf("accepted, yet %v refusals and %d reports", refusals, len(f.reports))
				}
				if tc.wantReport != nil && f.reports[0] != *tc.wantReport {
					t.Fatalf("report %+v, want %+v", f.reports[0], *tc.wantReport)
				}
				return
			}
			if refusals != 1 {
				t.Errorf("refusal counted %v times, want 1", refusals)
			}
			if tc.verdict == nil && len(f.reports) != 0 {
				t.Errorf("a refused request reached the callback: %+v", f.reports)
			}
			var e struct{ Error string }
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || !strings.Contains(e.Error, tc.wantErr) {
				t.Errorf("error body %q (%v), want an error containing %q", w.Body, err, tc.wantErr)
			}
		})
	}
}

func TestServerOptionalEndpoints(t *testing.T) {
	if _, err := NewServer(ServerConfig{}); err == nil {
		t.Fatal("NewServer without Readiness succeeded")
	}
	srv, err := NewServer(ServerConfig{Readiness: func() error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ method, path string }{
		{"GET", "/status"}, {"GET", "/metrics"}, {"POST", "/signal"},
	} {
		w := httptest.NewRecorder()
		srv.Handler().ServeHTTP(w, httptest.NewRequest(tc.method, tc.path, nil))
		if w.Code != 404 {
			t.Errorf("%s %s without a source = %d, want 404", tc.method, tc.path, w.Code)
		}
	}
	w := httptest.NewRecorder()
	srv.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/healthz", nil))
	if w.Code != 200 {
		t.Errorf("/healthz without Liveness = %d, want 200", w.Code)
	}
}

// The real server on loopback: the peer address is the kernel's, and ending
// the context shuts it down.
func TestServeAndShutdown(t *testing.T) {
	f := newFixture(t)
	f.probe.Report(Result{OK: true, RTT: time.Millisecond, At: time.Now()})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f.srv.Serve(ctx, ln) }()

	base := "http://" + ln.Addr().String()
	client := &http.Client{Timeout: 5 * time.Second}
	for _, path := range []string{"/healthz", "/readyz", "/status", "/metrics"} {
		resp, err := client.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET %s = %d", path, resp.StatusCode)
		}
	}
	resp, err := client.Post(base+"/signal", "application/json", bytes.NewBufferString(`{"state":"unhealthy","reason":"disk full"}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if got := f.received(); resp.StatusCode != 204 || len(got) != 1 {
		t.Fatalf("POST /signal from loopback = %d, %d reports", resp.StatusCode, len(got))
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after cancel")
	}
	if _, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		t.Fatal("listener still accepting after shutdown")
	}
}

func TestListenAndServeBadAddr(t *testing.T) {
	srv, err := NewServer(ServerConfig{Addr: "127.0.0.1:-1", Readiness: func() error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.ListenAndServe(context.Background()); err == nil {
		t.Fatal("ListenAndServe on a bad address succeeded")
	}
}
