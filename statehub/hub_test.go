package statehub

import (
	"bytes"
	"context"
	"errors"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/amf-edge/amf/lab/brokerstate"
	"github.com/amf-edge/amf/lab/brokerstate/brokerstatetest"
	"github.com/amf-edge/amf/mosquittodb"
	"github.com/amf-edge/amf/podsignal"
	"github.com/amf-edge/amf/sidecar/handover"
)

var (
	primary = podsignal.PodID{Namespace: "tod", Pod: "broker-a-1"}
	standby = podsignal.PodID{Namespace: "tod", Pod: "broker-b-1"}
	other   = podsignal.PodID{Namespace: "tod", Pod: "other-1"}
	auth    = FakeTokens{"tok-a": primary, "tok-b": standby, "tok-o": other}
)

// realStates has a real Mosquitto hold 20 retained messages and two
// sessions with 3 queued messages each, and returns the file it writes on
// SIGUSR1 (a snapshot) and as it stops (final).
func realStates(t *testing.T) (snapshot, final []byte) {
	t.Helper()
	bin := brokerstatetest.RequireMosquitto(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	m, err := brokerstate.StartMosquitto(ctx, bin, t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Kill)
	if err := brokerstate.Seed(ctx, m.Addr, brokerstate.Plan{Retained: 20, Sessions: 2, Queued: 3}); err != nil {
		t.Fatal(err)
	}
	// The sidecar's own levers: SIGUSR1 and the rename awaited by inotify,
	// then the file written as the broker stops.
	b := handover.Broker{PID: m.PID(), File: m.File}
	snap, err := b.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fin, err := b.Final(ctx, func() { _ = m.Signal(syscall.SIGTERM) })
	if err != nil {
		t.Fatal(err)
	}
	snapshot, final = snap.Data, fin.Data
	if err := m.WaitExit(ctx); err != nil {
		t.Logf("mosquitto exit: %v", err)
	}
	return snapshot, final
}

func newHub(t *testing.T) (*Hub, *httptest.Server) {
	t.Helper()
	h, err := New(Config{Authenticator: auth, Wait: 500 * time.Millisecond, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h.Handler())
	t.Cleanup(srv.Close)
	return h, srv
}

func client(srv *httptest.Server, pod podsignal.PodID, token string) *Client {
	return &Client{URL: srv.URL, Pod: pod, Token: token, HTTP: srv.Client()}
}

func TestAFinalStateHandedInIsFetchedWholeByThePodItIsHandedOnTo(t *testing.T) {
	_, final := realStates(t)
	h, srv := newHub(t)
	ctx := t.Context()

	fetched := make(chan State, 1)
	go func() { // the standby's sidecar polls before the state exists
		for ctx.Err() == nil {
			s, ok, err := client(srv, standby, "tok-b").Fetch(ctx, "")
			if err != nil {
				t.Errorf("fetch: %v", err)
				return
			}
			if ok {
				fetched <- s
				return
			}
		}
	}()
	id, err := client(srv, primary, "tok-a").HandIn(ctx, Final, final)
	if err != nil {
		t.Fatal(err)
	}
	var got State
	select {
	case got = <-h.Received():
	case <-time.After(5 * time.Second):
		t.Fatal("the hub told nothing of the state taken in")
	}
	if got.ID != id || got.From != primary || got.Kind != Final || !got.Summary.Shutdown || got.Summary.Retained != 20 || len(got.Summary.Sessions) != 2 || got.Data != nil {
		t.Fatalf("received %+v, want %s from %s, final, 20 retained, 2 sessions, no data", got, id, primary)
	}
	if _, err := h.HandOn(id, primary, standby); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-fetched:
		if !bytes.Equal(s.Data, final) || s.ID != id || s.From != primary || s.Kind != Final {
			t.Fatalf("fetched %s from %s (%s, %d bytes), want %s from %s, final, the %d bytes handed in", s.ID, s.From, s.Kind, len(s.Data), id, primary, len(final))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the standby's long poll did not return the state handed on to it")
	}
	// A sidecar that holds it already waits past it (the long poll), not
	// answered the same state again at once.
	if _, ok, err := client(srv, standby, "tok-b").Fetch(ctx, id); ok || err != nil {
		t.Fatalf("fetch naming the state held: ok %v, err %v; want the long poll to end with nothing", ok, err)
	}
	// Once its broker runs on it, it is gone: a sidecar started again
	// must not load it a second time over what its broker did since.
	h.Done(standby)
	if _, ok, err := client(srv, standby, "tok-b").Fetch(ctx, ""); ok || err != nil {
		t.Fatalf("after Done: fetched %v, err %v; want nothing", ok, err)
	}
}

func TestTheHubRefusesWhatItMustNotRelay(t *testing.T) {
	snapshot, final := realStates(t)
	torn := final[:len(final)-7]
	for _, tt := range []struct {
		name    string
		pod     podsignal.PodID
		token   string
		kind    Kind
		data    []byte
		status  string
		outcome string // counted in amf_statehub_requests_total
	}{
		{"no token", primary, "", Final, final, "401", outcomeUnauthorized},
		{"an unknown token", primary, "forged", Final, final, "401", outcomeUnauthorized},
		{"another pod's token", primary, "tok-o", Final, final, "403", outcomeForbidden},
		{"a torn file", primary, "tok-a", Final, torn, "422", outcomeRefused},
		{"a snapshot handed in as final", primary, "tok-a", Final, snapshot, "422", outcomeRefused},
		{"something that is not a state", primary, "tok-a", Snapshot, []byte("hello"), "422", outcomeRefused},
		{"no kind", primary, "tok-a", "", final, "400", outcomeRefused},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h, srv := newHub(t)
			_, err := client(srv, tt.pod, tt.token).HandIn(t.Context(), tt.kind, tt.data)
			if !errors.Is(err, ErrRefused) || !bytes.Contains([]byte(err.Error()), []byte(tt.status)) {
				t.Fatalf("hand in: %v, want refused with %s", err, tt.status)
			}
			select {
			case s := <-h.Received():
				t.Fatalf("refused, yet taken in: %+v", s)
			default:
			}
			if n := testutil.ToFloat64(h.m.requests.WithLabelValues("hand_in", tt.outcome)); n != 1 {
				t.Errorf("amf_statehub_requests_total{op=hand_in,outcome=%s} = %v, want 1", tt.outcome, n)
			}
		})
	}
	t.Run("a state handed on to another pod", func(t *testing.T) {
		h, srv := newHub(t)
		id, err := client(srv, primary, "tok-a").HandIn(t.Context(), Final, final)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.HandOn(id, primary, standby); err != nil {
			t.Fatal(err)
		}
		c := client(srv, standby, "tok-o") // other's token on standby's path
		if _, _, err := c.Fetch(t.Context(), ""); !errors.Is(err, ErrRefused) {
			t.Fatalf("fetch with another pod's token: %v, want refused", err)
		}
		if s, ok, err := client(srv, other, "tok-o").Fetch(t.Context(), ""); ok || err != nil {
			t.Fatalf("other's own fetch: %v %v; want nothing", s.ID, err)
		}
	})
	t.Run("a state replaced before it is handed on", func(t *testing.T) {
		h, srv := newHub(t)
		c := client(srv, primary, "tok-a")
		old, err := c.HandIn(t.Context(), Snapshot, snapshot)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.HandIn(t.Context(), Final, final); err != nil {
			t.Fatal(err)
		}
		if _, err := h.HandOn(old, primary, standby); !errors.Is(err, ErrNoState) {
			t.Fatalf("handing on a replaced state: %v, want ErrNoState", err)
		}
	})
}

func TestStatesExpireAndStayWithinTheBudget(t *testing.T) {
	now := time.Date(2026, 12, 6, 9, 0, 0, 0, time.UTC)
	h, err := New(Config{Authenticator: auth, MaxBytes: MaxStateBytes, TTL: time.Minute, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	big := make([]byte, MaxStateBytes/2+1)
	a, err := h.put(primary, "", "", Snapshot, mosquittodb.Summary{}, big)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.put(other, "", "", Snapshot, mosquittodb.Summary{}, big); err != nil {
		t.Fatalf("a second state that does not fit beside the first: %v, want the first evicted", err)
	}
	if _, err := h.HandOn(a.ID, primary, standby); !errors.Is(err, ErrNoState) {
		t.Fatalf("the evicted state handed on: %v", err)
	}
	<-h.Received() // the evicted one's notice
	o := <-h.Received()
	if _, err := h.HandOn(o.ID, other, standby); err != nil {
		t.Fatal(err)
	}
	if _, err := h.put(primary, "", "", Snapshot, mosquittodb.Summary{}, big); err == nil {
		t.Fatal("a state that fits only by evicting one handed on and not fetched was taken in")
	}
	now = now.Add(2 * time.Minute)
	if _, err := h.put(primary, "", "", Snapshot, mosquittodb.Summary{}, big); err != nil {
		t.Fatalf("after the TTL the handed-on state still takes the room: %v", err)
	}
	if _, err := New(Config{Authenticator: auth, MaxBytes: MaxStateBytes - 1}); err == nil {
		t.Fatal("a budget below one state accepted")
	}
}

// TestAFailoverTakesOnlyTheStateOfAPodHeldBeforeIt: the hub keeps when it
// first held each pod's states (Since), so that a failover can ask for the
// newest state of the retired primary's pods without taking that of the
// Deployment's next pod, which comes back as the standby with an empty
// broker and hands its snapshots in within seconds of the retirement.
func TestAFailoverTakesOnlyTheStateOfAPodHeldBeforeIt(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 15, 0, 0, 0, time.UTC)
	now := t0
	h, err := New(Config{Authenticator: auth, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	retired := podsignal.PodID{Namespace: primary.Namespace, Pod: "broker-a-1"}
	comeback := podsignal.PodID{Namespace: primary.Namespace, Pod: "broker-a-2"}
	put := func(at time.Duration, pod podsignal.PodID, retained int) State {
		t.Helper()
		now = t0.Add(at)
		s, err := h.put(pod, "broker-a", "node-0", Snapshot, mosquittodb.Summary{Retained: retained}, []byte("x"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	put(0, retired, 100)
	last := put(2*time.Second, retired, 101) // the retired pod's newest
	retirement := t0.Add(3 * time.Second)
	late := put(5*time.Second, comeback, 0)
	if last.Since != t0 || late.Since != late.At {
		t.Fatalf("Since: %v and %v, want the first state's time of each pod (%v, %v)", last.Since, late.Since, t0, late.At)
	}
	for _, tc := range []struct {
		name   string
		heldBy time.Time
		want   string
	}{
		{"by the retirement: the retired pod's newest", retirement, last.ID},
		{"any: the newest of all", time.Time{}, late.ID},
		{"before any was held: none", t0.Add(-time.Second), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := h.LatestOwned(primary.Namespace, "broker-a", tc.heldBy, "")
			if ok != (tc.want != "") || got.ID != tc.want {
				t.Errorf("LatestOwned = %q (%v), want %q", got.ID, ok, tc.want)
			}
		})
	}
}
