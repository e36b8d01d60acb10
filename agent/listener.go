package agent

import (
	"container/list"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/amf-edge/amf/podsignal"
	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
)

// trackedConn is a client connection accepted by the agent's listener. It
// carries the client's session, so the hooks find the identity of a mochi
// client from its connection (cl.Net.Conn) without a map to keep in sync.
type trackedConn struct {
	net.Conn
	sess atomic.Pointer[session]
	// cl is the broker's client of this connection, from its CONNECT on:
	// what a replacing session of the same pod disconnects.
	cl  atomic.Pointer[mqtt.Client]
	src netip.Addr
	// Guarded by admission.mu.
	stage stage
	elem  *list.Element   // in admission.pending
	id    podsignal.PodID // from stageSession on
}

// sessionOf returns the session of a connection, nil before authentication.
func sessionOf(c net.Conn) *session {
	if tc, ok := c.(*trackedConn); ok {
		return tc.sess.Load()
	}
	return nil
}

// tcpListener is the agent's mochi listener. Unlike mochi's own TCP listener it
// admits connections by the agent's rules (admission: bounded pending
// connections, per source and in all, apart from the authenticated
// sessions), gives a client a deadline to send CONNECT, and ends a client's
// session when its connection is gone even where mochi does not call
// OnDisconnect (a CONNACK that could not be written).
type tcpListener struct {
	id        string
	address   string
	handshake time.Duration
	adm       *admission
	onRefuse  func(remote, reason string) // a connection was refused or evicted before it authenticated
	onDone    func(tc *trackedConn)       // a connection ended
	// disconnect disconnects the broker's clients of this listener at Close,
	// in place of mochi's CloseFn: that one (Clients.GetByListener in
	// v2.7.9) takes the clients' read lock twice, and a client ending in
	// between (Clients.Delete waiting for the write lock) deadlocks the
	// shutdown for good, as a 50-runs-by-four test pass caught.
	disconnect func(listenerID string)
	log        *slog.Logger

	ln     net.Listener
	mu     sync.Mutex
	conns  map[*trackedConn]struct{}
	closed bool
	wg     sync.WaitGroup
}

var _ listeners.Listener = (*tcpListener)(nil)

func (l *tcpListener) ID() string       { return l.id }
func (l *tcpListener) Protocol() string { return "tcp" }

// Address returns the bound address once Init has run.
func (l *tcpListener) Address() string {
	if l.ln != nil {
		return l.ln.Addr().String()
	}
	return l.address
}

// Init binds the address; mochi calls it from AddListener.
func (l *tcpListener) Init(*slog.Logger) error {
	ln, err := net.Listen("tcp", l.address)
	if err != nil {
		return err
	}
	l.ln = ln
	l.conns = make(map[*trackedConn]struct{})
	return nil
}

// Serve accepts connections until Close.
func (l *tcpListener) Serve(establish listeners.EstablishFn) {
	var backoff time.Duration
	for {
		conn, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: wait instead of spinning,
			// as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			l.log.Warn("accept failed", slog.Any("error", err), slog.Duration("retry_in", backoff))
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		tc := &trackedConn{Conn: conn, src: sourceOf(conn)}
		evicted, refused := l.adm.accept(tc)
		if evicted != nil {
			// The oldest connection that has not said a word makes room.
			l.onRefuse(evicted.RemoteAddr().String(), refuseEvicted)
			_ = evicted.Close()
		}
		if refused != "" {
			// Counted before the close, so a client that sees the refusal
			// also finds it counted.
			l.onRefuse(conn.RemoteAddr().String(), refused)
			_ = conn.Close()
			continue
		}
		if !l.track(tc) {
			l.adm.release(tc)
			_ = conn.Close()
			return
		}
		// mochi reads CONNECT without a deadline; a client that never sends one
		// would hold its slot forever. After CONNECT mochi sets the keepalive
		// deadline itself.
		_ = conn.SetDeadline(time.Now().Add(l.handshake))
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			err := establish(l.id, tc)
			if l.adm.release(tc) == stageIdle && errors.Is(err, os.ErrDeadlineExceeded) {
				l.onRefuse(tc.RemoteAddr().String(), refuseConnectTimeout)
			}
			l.onDone(tc)
			l.untrack(tc)
			// Logged last, so a reader of this line knows the slot is free.
			attrs := []slog.Attr{slog.String("remote", tc.RemoteAddr().String())}
			if err != nil {
				attrs = append(attrs, slog.String("error", err.Error()))
			}
			l.log.LogAttrs(context.Background(), slog.LevelDebug, "connection closed", attrs...)
		}()
	}
}

func (l *tcpListener) track(tc *trackedConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.conns[tc] = struct{}{}
	return true
}

func (l *tcpListener) untrack(tc *trackedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.conns, tc)
}

// Close stops accepting, lets mochi disconnect its clients, closes the
// connections that never authenticated, and waits for them all to end.
func (l *tcpListener) Close(closeClients listeners.CloseFn) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	l.mu.Unlock()
	if l.ln != nil {
		_ = l.ln.Close()
	}
	if l.disconnect != nil {
		l.disconnect(l.id)
	} else {
		closeClients(l.id)
	}
	l.mu.Lock()
	for tc := range l.conns {
		_ = tc.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
}
