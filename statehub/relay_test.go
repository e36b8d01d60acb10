package statehub

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// peerOnce refuses the first relay, as a peer whose TokenReview is not
// reachable yet would, then proves node-0.
type peerOnce struct{ calls atomic.Int32 }

func (p *peerOnce) AuthenticatePeer(_ context.Context, token string) (string, error) {
	if p.calls.Add(1) == 1 {
		return "", errors.New("TokenReview unavailable (test)")
	}
	if token != "agent-0" {
		return "", errors.New("not an agent (test)")
	}
	return "node-0", nil
}

func tokenFile(t *testing.T, token string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestAStateRelayedToAnotherNodesHubIsHandedOnThere: the primary's pod
// hands its snapshot in to its node's hub; the relay sends it to the hub
// of the standby's node, trying again after a refusal; there it is known
// by its Deployment and handed on to the standby's pod, which fetches the
// very bytes its primary's broker wrote.
func TestAStateRelayedToAnotherNodesHubIsHandedOnThere(t *testing.T) {
	snapshot, _ := realStates(t)
	ctx := t.Context()
	here, hereSrv := newHub(t)
	peers := &peerOnce{}
	there, err := New(Config{Authenticator: auth, Peers: peers, Wait: 500 * time.Millisecond, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	thereSrv := httptest.NewServer(there.Handler())
	t.Cleanup(thereSrv.Close)

	relay, err := NewRelay(here, RelayConfig{TokenFile: tokenFile(t, "agent-0"), Retry: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })

	id, err := client(hereSrv, primary, "tok-a").HandIn(ctx, Snapshot, snapshot)
	if err != nil {
		t.Fatal(err)
	}
	st, ok := here.Copy(primary, id)
	if !ok || !bytes.Equal(st.Data, snapshot) {
		t.Fatalf("Copy(%s) = %v, %d bytes; want the %d bytes handed in", id, ok, len(st.Data), len(snapshot))
	}
	st.Owner = "broker-a"
	relay.Forward(thereSrv.URL, st)

	var got State
	select {
	case got = <-there.Received():
	case <-time.After(10 * time.Second):
		t.Fatal("the standby's hub took nothing in from the relay")
	}
	if got.From != primary || got.Owner != "broker-a" || got.Via != "node-0" || got.Kind != Snapshot || got.Summary.Retained != 20 {
		t.Fatalf("relayed in: %+v; want from %s, owner broker-a, via node-0, a snapshot of 20 retained", got, primary)
	}
	if peers.calls.Load() < 2 {
		t.Fatalf("the peer was asked %d times; the first refusal should have been tried again", peers.calls.Load())
	}
	latest, ok := there.LatestOwned(primary.Namespace, "broker-a", time.Time{}, "")
	if !ok || latest.ID != got.ID {
		t.Fatalf("LatestOwned = %s %v, want %s", latest.ID, ok, got.ID)
	}
	if _, ok := there.LatestOwned(primary.Namespace, "broker-b", time.Time{}, ""); ok {
		t.Fatal("LatestOwned found a state of a Deployment that relayed none")
	}
	if _, err := there.HandOn(got.ID, primary, standby); err != nil {
		t.Fatal(err)
	}
	s, ok, err := client(thereSrv, standby, "tok-b").Fetch(ctx, "")
	if err != nil || !ok || !bytes.Equal(s.Data, snapshot) {
		t.Fatalf("standby's fetch: ok %v err %v, %d bytes; want the %d bytes of the primary's snapshot", ok, err, len(s.Data), len(snapshot))
	}
	if n := testutil.ToFloat64(here.m.requests.WithLabelValues("relay_out", "failed")); n < 1 {
		t.Errorf("relay_out failed = %v, want the refusal counted", n)
	}
	if n := testutil.ToFloat64(there.m.requests.WithLabelValues("relay_in", outcomeOK)); n != 1 {
		t.Errorf("relay_in ok = %v, want 1", n)
	}
}

// TestTheRelayPathTakesOnlyAnAgentsWholeState: a pod's own token, a torn
// file, a missing owner, and a hub without peers are refused, and nothing
// is taken in.
func TestTheRelayPathTakesOnlyAnAgentsWholeState(t *testing.T) {
	snapshot, final := realStates(t)
	withPeers := func(t *testing.T) (*Hub, *httptest.Server) {
		h, err := New(Config{Authenticator: auth, Peers: FakePeers{"agent-0": "node-0"}, Registerer: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(h.Handler())
		t.Cleanup(srv.Close)
		return h, srv
	}
	for _, tt := range []struct {
		name         string
		peers        bool
		token, owner string
		kind         Kind
		data         []byte
		status       int
	}{
		{"a hub without peers", false, "agent-0", "broker-a", Snapshot, snapshot, http.StatusNotFound},
		{"a pod's own token", true, "tok-a", "broker-a", Snapshot, snapshot, http.StatusUnauthorized},
		{"no token", true, "", "broker-a", Snapshot, snapshot, http.StatusUnauthorized},
		{"no owner", true, "agent-0", "", Snapshot, snapshot, http.StatusBadRequest},
		{"a torn file", true, "agent-0", "broker-a", Snapshot, snapshot[:len(snapshot)-5], http.StatusUnprocessableEntity},
		{"a snapshot relayed as final", true, "agent-0", "broker-a", Final, snapshot, http.StatusUnprocessableEntity},
		{"the final state", true, "agent-0", "broker-a", Final, final, http.StatusNoContent},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h, srv := newHub(t)
			if tt.peers {
				h, srv = withPeers(t)
			}
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPut, srv.URL+RelayPrefix+primary.Namespace+"/"+primary.Pod, bytes.NewReader(tt.data))
			if err != nil {
				t.Fatal(err)
			}
			if tt.token != "" {
				req.Header.Set("Authorization", "Bearer "+tt.token)
			}
			req.Header.Set(KindHeader, string(tt.kind))
			req.Header.Set(OwnerHeader, tt.owner)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tt.status)
			}
			_, held := h.LatestOwned(primary.Namespace, "broker-a", time.Time{}, "")
			if want := tt.status == http.StatusNoContent; held != want {
				t.Fatalf("held after the relay: %v, want %v", held, want)
			}
			if held && strings.Count(mustLatest(t, h).ID, "@node-0") != 1 {
				t.Fatalf("relayed state's ID %q does not name the node it came via", mustLatest(t, h).ID)
			}
		})
	}
}

func mustLatest(t *testing.T, h *Hub) State {
	s, _ := h.LatestOwned(primary.Namespace, "broker-a", time.Time{}, "")
	return s
}
