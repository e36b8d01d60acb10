package agent

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mochi-mqtt/server/v2/listeners"
)

// trackedConn is a client connection accepted by the agent's listener. It
// carries the client's session, so the hooks find the identity of a mochi
// client from its connection (cl.Net.Conn) without a map to keep in sync.
type trackedConn struct {
	net.Conn
	sess atomic.Pointer[session]
}

// sessionOf returns the session of a connection, nil before authentication.
func sessionOf(c net.Conn) *session {
	if tc, ok := c.(*trackedConn); ok {
		return tc.sess.Load()
	}
	return nil
}

// tcpListener is the agent's mochi listener. Unlike mochi's own TCP listener it
// bounds the number of open connections (authenticated or not), gives a client
// a deadline to send CONNECT, and ends a client's session when its connection
// is gone even where mochi does not call OnDisconnect (a CONNACK that could
// not be written).
type tcpListener struct {
	id        string
	address   string
	handshake time.Duration
	slots     chan struct{}
	onRefuse  func(remote string)   // a connection over the limit was closed
	onDone    func(tc *trackedConn) // a connection ended
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
		select {
		case l.slots <- struct{}{}:
		default:
			// Counted before the close, so a client that sees the refusal
			// also finds it counted.
			l.onRefuse(conn.RemoteAddr().String())
			_ = conn.Close()
			continue
		}
		tc := &trackedConn{Conn: conn}
		if !l.track(tc) {
			_ = conn.Close()
			<-l.slots
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
			l.onDone(tc)
			l.untrack(tc)
			<-l.slots
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
