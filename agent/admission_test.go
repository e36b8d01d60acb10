package agent

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/amf-edge/amf/podsignal"
)

// fakeConn is a connection whose source and unread bytes the test sets.
type fakeConn struct {
	net.Conn
	waiting bool
}

func newConn(src string, waiting bool) *trackedConn {
	return &trackedConn{Conn: &fakeConn{waiting: waiting}, src: netip.MustParseAddr(src)}
}

func fakeWaiting(c net.Conn) bool { return c.(*fakeConn).waiting }

func TestAdmissionKeepsPendingConnectionsApartFromSessions(t *testing.T) {
	type step struct {
		do      string // accept, auth (authenticating + promote), release
		conn    string // name of the connection
		src     string
		waiting bool
		pod     string // for auth

		refused  string // accept: the refusal reason, "" when admitted
		evicted  string // accept: which connection was evicted
		replaced string // auth: which session was replaced
		authFail bool   // auth: refused (evicted first, or no session slot)
	}
	for _, tc := range []struct {
		name                              string
		maxPending, perSource, maxSession int
		steps                             []step
		pending, sessions                 int // held at the end
	}{
		{
			name: "one source holds at most its own share", maxPending: 8, perSource: 2, maxSession: 4,
			steps: []step{
				{do: "accept", conn: "a1", src: "10.0.0.1"},
				{do: "accept", conn: "a2", src: "10.0.0.1"},
				// At its share, a source's newcomer takes its own oldest idle place…
				{do: "accept", conn: "a3", src: "10.0.0.1", evicted: "a1"},
				{do: "accept", conn: "b1", src: "10.0.0.2"},
			},
			pending: 3,
		},
		{
			name: "a source whose connections all speak is refused above its share", maxPending: 8, perSource: 2, maxSession: 4,
			steps: []step{
				// …and is refused when none of them is idle.
				{do: "accept", conn: "a1", src: "10.0.0.1", waiting: true},
				{do: "accept", conn: "a2", src: "10.0.0.1"},
				{do: "authenticating", conn: "a2"},
				{do: "accept", conn: "a3", src: "10.0.0.1", refused: refuseSourceLimit},
			},
			pending: 2,
		},
		{
			name: "a source's share frees as its connections authenticate", maxPending: 8, perSource: 1, maxSession: 4,
			steps: []step{
				{do: "accept", conn: "a1", src: "10.0.0.1"},
				{do: "auth", conn: "a1", pod: "p1"},
				{do: "accept", conn: "a2", src: "10.0.0.1"},
			},
			pending: 1, sessions: 1,
		},
		{
			name: "a full pool evicts its oldest idle connection", maxPending: 2, perSource: 4, maxSession: 4,
			steps: []step{
				{do: "accept", conn: "f1", src: "10.0.0.9"},
				{do: "accept", conn: "f2", src: "10.0.0.9"},
				{do: "accept", conn: "s1", src: "10.0.0.1", evicted: "f1"},
				{do: "auth", conn: "s1", pod: "p1"},
			},
			pending: 1, sessions: 1,
		},
		{
			name: "a connection whose CONNECT waits in the kernel is not evicted", maxPending: 2, perSource: 4, maxSession: 4,
			steps: []step{
				{do: "accept", conn: "s1", src: "10.0.0.1", waiting: true},
				{do: "accept", conn: "f1", src: "10.0.0.9"},
				{do: "accept", conn: "s2", src: "10.0.0.2", evicted: "f1"},
			},
			pending: 2,
		},
		{
			name: "a full pool evicts from the source that holds the most", maxPending: 3, perSource: 4, maxSession: 4,
			steps: []step{
				{do: "accept", conn: "a1", src: "10.0.0.1"},
				{do: "accept", conn: "b1", src: "10.0.0.2"},
				{do: "accept", conn: "b2", src: "10.0.0.2"},
				{do: "accept", conn: "c1", src: "10.0.0.3", evicted: "b1"},
				// Now every source holds one: a newcomer of a source that
				// holds as many is refused, a lone one takes the oldest place.
				{do: "accept", conn: "c2", src: "10.0.0.3", refused: refuseCapacity},
				{do: "accept", conn: "d1", src: "10.0.0.4", evicted: "a1"},
			},
			pending: 3,
		},
		{
			name: "a connection being authenticated is not evicted", maxPending: 1, perSource: 4, maxSession: 4,
			steps: []step{
				{do: "accept", conn: "s1", src: "10.0.0.1"},
				{do: "authenticating", conn: "s1"},
				{do: "accept", conn: "f1", src: "10.0.0.9", refused: refuseCapacity},
			},
			pending: 1,
		},
		{
			name: "an evicted connection cannot authenticate", maxPending: 1, perSource: 4, maxSession: 4,
			steps: []step{
				{do: "accept", conn: "f1", src: "10.0.0.9"},
				{do: "accept", conn: "f2", src: "10.0.0.8", evicted: "f1"},
				{do: "auth", conn: "f1", pod: "p1", authFail: true},
			},
			pending: 1,
		},
		{
			name: "a pod's new session replaces its old one", maxPending: 4, perSource: 4, maxSession: 2,
			steps: []step{
				{do: "accept", conn: "a1", src: "10.0.0.1"},
				{do: "auth", conn: "a1", pod: "p1"},
				{do: "accept", conn: "a2", src: "10.0.0.1"},
				{do: "auth", conn: "a2", pod: "p1", replaced: "a1"},
				{do: "accept", conn: "b1", src: "10.0.0.2"},
				{do: "auth", conn: "b1", pod: "p2"},
				// The replaced connection ending does not free the pod's slot.
				{do: "release", conn: "a1"},
				{do: "accept", conn: "c1", src: "10.0.0.3"},
				{do: "auth", conn: "c1", pod: "p3", authFail: true},
			},
			sessions: 2,
		},
		{
			name: "sessions of other pods fill the session slots only", maxPending: 4, perSource: 4, maxSession: 1,
			steps: []step{
				{do: "accept", conn: "a1", src: "10.0.0.1"},
				{do: "auth", conn: "a1", pod: "p1"},
				{do: "accept", conn: "b1", src: "10.0.0.2"},
				{do: "auth", conn: "b1", pod: "p2", authFail: true},
				{do: "release", conn: "b1"},
				{do: "release", conn: "a1"},
				{do: "accept", conn: "b2", src: "10.0.0.2"},
				{do: "auth", conn: "b2", pod: "p2"},
			},
			sessions: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAdmission(tc.maxPending, tc.perSource, tc.maxSession, fakeWaiting)
			conns := map[string]*trackedConn{}
			name := func(c *trackedConn) string {
				for n, x := range conns {
					if x == c {
						return n
					}
				}
				return ""
			}
			for i, s := range tc.steps {
				switch s.do {
				case "accept":
					c := newConn(s.src, s.waiting)
					conns[s.conn] = c
					ev, refused := a.accept(c)
					if refused != s.refused || name(ev) != s.evicted {
						t.Fatalf("step %d: accept %s = evicted %q, refused %q; want %q, %q", i, s.conn, name(ev), refused, s.evicted, s.refused)
					}
				case "authenticating":
					if !a.authenticating(conns[s.conn]) {
						t.Fatalf("step %d: %s may not authenticate", i, s.conn)
					}
				case "auth":
					c := conns[s.conn]
					ok := a.authenticating(c)
					var old *trackedConn
					if ok {
						old, ok = a.promote(c, podsignal.PodID{Namespace: "ns", Pod: s.pod})
					}
					if ok == s.authFail || name(old) != s.replaced {
						t.Fatalf("step %d: auth %s = ok %v, replaced %q; want ok %v, replaced %q", i, s.conn, ok, name(old), !s.authFail, s.replaced)
					}
				case "release":
					a.release(conns[s.conn])
				}
			}
			if p, n := a.counts(); p != tc.pending || n != tc.sessions {
				t.Errorf("held: %d pending, %d sessions; want %d, %d", p, n, tc.pending, tc.sessions)
			}
			for _, c := range conns {
				a.release(c)
			}
			if p, n := a.counts(); p != 0 || n != 0 || len(a.bySource) != 0 {
				t.Errorf("after every release: %d pending, %d sessions, %d sources; want none", p, n, len(a.bySource))
			}
		})
	}
}

func TestBytesWaitingSeesACONNECTBeforeAnyoneReadsIt(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	if bytesWaiting(server) {
		t.Fatal("a silent connection reads as waiting")
	}
	if _, err := client.Write([]byte{0x10}); err != nil {
		t.Fatal(err)
	}
	// Loopback queues the byte in the receiver's buffer before write
	// returns; the loop only bounds a slower stack.
	for !bytesWaiting(server) {
		select {
		case <-timeout():
			t.Fatal("the byte written never showed as waiting")
		default:
		}
	}
	var b [1]byte
	if _, err := server.Read(b[:]); err != nil || b[0] != 0x10 {
		t.Fatalf("read %x, %v: the peek consumed the byte", b, err)
	}
	if bytesWaiting(server) {
		t.Error("a drained connection reads as waiting")
	}
}

func TestLogSamplerLetsATenthThroughAndCountsTheRest(t *testing.T) {
	s := &logSampler{perSecond: 2}
	t0 := time.Unix(1000, 0)
	type call struct {
		kind       string
		at         time.Duration
		ok         bool
		suppressed int
	}
	for i, c := range []call{
		{"a", 0, true, 0},
		{"a", 100 * time.Millisecond, true, 0},
		{"a", 200 * time.Millisecond, false, 0},
		{"b", 300 * time.Millisecond, true, 0}, // kinds are apart
		{"a", 900 * time.Millisecond, false, 0},
		{"a", 1100 * time.Millisecond, true, 2}, // a new second: the two held back are said
		{"a", 1200 * time.Millisecond, true, 0},
	} {
		n, ok := s.allow(c.kind, t0.Add(c.at))
		if ok != c.ok || n != c.suppressed {
			t.Errorf("call %d (%s at %v) = %d, %v; want %d, %v", i, c.kind, c.at, n, ok, c.suppressed, c.ok)
		}
	}
}
