package actuate_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// wireReq is one request the agent's client sent, as its transport saw it.
type wireReq struct {
	method, path, query string
	body                []byte
	obj                 runtime.Object // body or watch event decoded, if it could be
	sent, done          time.Time      // handed to the connection; response headers back
	status              int
}

// wire wraps the agent's client-go transport and reports its requests to
// the expectations registered with expect. It is how the tests and
// benchmarks see the instant a request goes on the wire, and how they stop
// an agent right after a given write reached the API server.
type wire struct {
	mu    sync.Mutex
	waits []*wireWait
	drops []*func(wireReq) bool
	sent  []wireReq // every request answered, with tap
	tap   bool
}

// record keeps every request answered from now on, for sentSoFar,
// forgetting those kept before.
func (w *wire) record() {
	w.mu.Lock()
	w.tap, w.sent = true, nil
	w.mu.Unlock()
}

// sentSoFar returns the requests answered since record.
func (w *wire) sentSoFar() []wireReq {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.sent)
}

// errDropped is what the agent's client gets for a request the test dropped.
var errDropped = errors.New("dropped by the test before it reached the API server")

// drop makes every request matching (before it is sent: no status) fail
// without reaching the API server, as if the agent had stopped before it,
// until the returned undo is called: the client is shared by the agents of a
// test, and only the stopped one must lose those writes.
func (w *wire) drop(match func(wireReq) bool) (undo func()) {
	m := &match
	w.mu.Lock()
	w.drops = append(w.drops, m)
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		w.drops = slices.DeleteFunc(w.drops, func(d *func(wireReq) bool) bool { return d == m })
		w.mu.Unlock()
	}
}

func (w *wire) dropped(r wireReq) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range w.drops {
		if (*m)(r) {
			return true
		}
	}
	return false
}

type wireWait struct {
	match func(wireReq) bool
	then  func() // run before the response is handed back to the agent
	ch    chan wireReq
}

// methodWatchEvent is the method of the pseudo-requests reported for the
// events of a watch response.
const methodWatchEvent = "WATCH-EVENT"

// install wraps cfg's transport.
func (w *wire) install(cfg *rest.Config) {
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			r := wireReq{method: req.Method, path: req.URL.Path, query: req.URL.RawQuery}
			if req.GetBody != nil {
				if rc, err := req.GetBody(); err == nil {
					r.body, _ = io.ReadAll(rc)
					_ = rc.Close()
				}
			}
			if len(r.body) > 0 {
				r.obj, _, _ = scheme.Codecs.UniversalDeserializer().Decode(r.body, nil, nil)
			}
			if w.dropped(r) {
				return nil, errDropped
			}
			r.sent = time.Now()
			resp, err := rt.RoundTrip(req)
			r.done = time.Now()
			if resp != nil {
				r.status = resp.StatusCode
				if req.URL.Query().Get("watch") == "true" {
					resp.Body = &watchBody{ReadCloser: resp.Body, w: w, path: r.path, query: r.query}
				}
			}
			w.observe(r)
			return resp, err
		})
	}
}

// expect registers a one-shot expectation: the first request matching gets
// then run (if not nil) before the agent sees the response, and is delivered
// on the returned channel.
func (w *wire) expect(match func(wireReq) bool, then func()) <-chan wireReq {
	x := &wireWait{match: match, then: then, ch: make(chan wireReq, 1)}
	w.mu.Lock()
	w.waits = append(w.waits, x)
	w.mu.Unlock()
	return x.ch
}

func (w *wire) observe(r wireReq) {
	w.mu.Lock()
	if w.tap && r.method != methodWatchEvent {
		w.sent = append(w.sent, r)
	}
	var hit []*wireWait
	kept := w.waits[:0]
	for _, x := range w.waits {
		if x.match(r) {
			hit = append(hit, x)
		} else {
			kept = append(kept, x)
		}
	}
	clear(w.waits[len(kept):])
	w.waits = kept
	w.mu.Unlock()
	for _, x := range hit {
		if x.then != nil {
			x.then()
		}
		x.ch <- r
	}
}

// watchBody decodes a protobuf watch response (client-go's default for
// built-in types: frames of a 4-byte big-endian length and a WatchEvent) and
// reports each event's object as a methodWatchEvent request, sent = when the
// read completing its frame returned.
type watchBody struct {
	io.ReadCloser
	w           *wire
	path, query string
	buf         []byte
}

func (b *watchBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		at := time.Now()
		b.buf = append(b.buf, p[:n]...)
		for len(b.buf) >= 4 {
			size := int(binary.BigEndian.Uint32(b.buf))
			if len(b.buf) < 4+size {
				break
			}
			var ev metav1.WatchEvent
			if ev.Unmarshal(b.buf[4:4+size]) == nil {
				obj, _, _ := scheme.Codecs.UniversalDeserializer().Decode(ev.Object.Raw, nil, nil)
				b.w.observe(wireReq{method: methodWatchEvent, path: b.path, query: b.query, obj: obj, sent: at})
			}
			b.buf = b.buf[4+size:]
		}
	}
	return n, err
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// isDeploymentPath says whether path is the API path of Deployment name
// (and, with sub, of its subresource). Any namespace: a wire carries one
// test's agent, and that agent acts in the test's namespace only.
func isDeploymentPath(path, name, sub string) bool {
	rest, ok := strings.CutPrefix(path, "/apis/apps/v1/namespaces/")
	if !ok {
		return false
	}
	_, rest, ok = strings.Cut(rest, "/")
	want := "deployments/" + name
	if sub != "" {
		want += "/" + sub
	}
	return ok && rest == want
}

// scaleTo matches the update of name's scale subresource to replicas.
func scaleTo(name string, replicas int32) func(wireReq) bool {
	return func(r wireReq) bool {
		s, ok := r.obj.(*autoscalingv1.Scale)
		return ok && r.method == http.MethodPut && isDeploymentPath(r.path, name, "scale") && s.Spec.Replicas == replicas && r.status < 300
	}
}

// readyOnWatch matches the event of a watch on Deployment name that shows it
// Ready (readyReplicas >= 1 at its current generation).
func readyOnWatch(name string) func(wireReq) bool {
	return func(r wireReq) bool {
		d, ok := r.obj.(*appsv1.Deployment)
		return ok && r.method == methodWatchEvent && d.Name == name && d.Status.ObservedGeneration >= d.Generation && d.Status.ReadyReplicas >= 1
	}
}

// recordPhase matches a successful write of name's switchover record in phase.
func recordPhase(name string, phase string) func(wireReq) bool {
	write := recordWrite(name, phase)
	return func(r wireReq) bool { return write(r) && r.status < 300 }
}

// recordWrite matches a write of name's switchover record in phase, sent or
// not (for drop).
func recordWrite(name string, phase string) func(wireReq) bool {
	want := []byte(`\"phase\":\"` + phase + `\"`)
	return func(r wireReq) bool {
		return r.method == http.MethodPatch && isDeploymentPath(r.path, name, "") && bytes.Contains(r.body, want)
	}
}

// recordMove matches a successful compare-and-swap of name's record (the
// JSON patch of writeRecord's one-round-trip path) from phase from to to.
func recordMove(name string, from, to string) func(wireReq) bool {
	return func(r wireReq) bool {
		if r.method != http.MethodPatch || !isDeploymentPath(r.path, name, "") || r.status >= 300 {
			return false
		}
		var ops []struct{ Op, Value string }
		if json.Unmarshal(r.body, &ops) != nil || len(ops) != 2 || ops[0].Op != "test" || ops[1].Op != "replace" {
			return false
		}
		var was, is struct{ Phase string }
		return json.Unmarshal([]byte(ops[0].Value), &was) == nil && json.Unmarshal([]byte(ops[1].Value), &is) == nil &&
			was.Phase == from && is.Phase == to
	}
}

// allOf matches the request that completes a match of every one of ms, in
// any order (each request counts for the first unmatched m it matches).
// Stateful: for one expectation only (wire.observe calls it under its lock).
func allOf(ms ...func(wireReq) bool) func(wireReq) bool {
	seen := make([]bool, len(ms))
	return func(r wireReq) bool {
		for i, m := range ms {
			if !seen[i] && m(r) {
				seen[i] = true
				break
			}
		}
		for _, s := range seen {
			if !s {
				return false
			}
		}
		return true
	}
}
