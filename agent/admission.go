package agent

import (
	"container/list"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/amf-edge/amf/podsignal"
)

// admission decides which connections the agent's broker holds. It keeps
// two pools apart, so that one cannot starve the other:
//
//   - pending: connections that have not authenticated yet, at most
//     maxPending in all and perSource from one source address. A newcomer
//     from a source at its share evicts that source's oldest idle
//     connection (refused only when none is idle). When the pool is full, a new connection evicts an idle one (its CONNECT not read by
//     the broker, and no byte of it waiting in the kernel either) from the
//     source that holds the most, if that source holds more than the
//     newcomer's: a sidecar connects once, from its pod's own address, so
//     a flooder's reconnects only take each other's places. Its CONNECT
//     follows the TCP handshake at once, so from then on it is not idle,
//     even before the broker's goroutine has read it. Only a flood from as
//     many addresses as the pool has places (256 by default) can still take
//     a sidecar's place, the oldest first.
//   - sessions: authenticated connections, at most maxSessions, and one per
//     pod. A pod's new session replaces its older one instead of being
//     refused: a sidecar that reconnects while its old connection still
//     looks open (a silent network loss, noticed only at the keepalive) must
//     get in at once, and whoever holds a pod's token can only displace that
//     same pod, which the token already lets it speak for.
//
// Unauthenticated connections never take a session slot, so the node's
// sidecars get in whatever the pending pool holds.
type admission struct {
	maxPending  int
	perSource   int
	maxSessions int
	// waiting reports whether bytes of c wait unread in the kernel
	// (bytesWaiting; a fake in unit tests).
	waiting func(c net.Conn) bool

	mu       sync.Mutex
	pending  *list.List // of *trackedConn, oldest first
	bySource map[netip.Addr]int
	sessions map[podsignal.PodID]*trackedConn
}

// The stages of a connection in admission; guarded by admission.mu.
type stage int

const (
	stageIdle           stage = iota // accepted, CONNECT not read yet: may be evicted
	stageAuthenticating              // CONNECT read, token being checked
	stageSession                     // authenticated, holding a session slot
	stageGone                        // refused, evicted, replaced or ended
)

func newAdmission(maxPending, perSource, maxSessions int, waiting func(net.Conn) bool) *admission {
	return &admission{
		waiting:     waiting,
		maxPending:  maxPending,
		perSource:   perSource,
		maxSessions: maxSessions,
		pending:     list.New(),
		bySource:    make(map[netip.Addr]int),
		sessions:    make(map[podsignal.PodID]*trackedConn),
	}
}

// sourceOf is the address a connection comes from; all connections whose
// address is not IP share the zero address.
func sourceOf(c net.Conn) netip.Addr {
	ap, err := netip.ParseAddrPort(c.RemoteAddr().String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// bytesWaiting peeks, without blocking and without taking the read lock the
// broker's goroutine holds while it waits, at whether c has bytes queued in
// the kernel. A connection it cannot ask is reported as waiting (never
// evicted on a guess).
func bytesWaiting(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	waiting := true
	var b [1]byte
	if err := rc.Control(func(fd uintptr) {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		// n == 0 without an error is the peer's FIN: nothing worth keeping.
		waiting = err == nil && n > 0
	}); err != nil {
		return true
	}
	return waiting
}

// accept admits tc to the pending pool. It returns the refusal reason when
// tc may not stay, and the idle connection it evicted to make room, if any:
// the caller closes both.
func (a *admission) accept(tc *trackedConn) (evicted *trackedConn, refused string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case a.bySource[tc.src] >= a.perSource:
		// The source's own oldest idle connection makes room: a sidecar
		// that shares its address with sockets that never speak still
		// gets in, and a source never holds more than its share.
		evicted = a.oldestIdle(tc.src)
		if evicted == nil {
			tc.stage = stageGone
			return nil, refuseSourceLimit
		}
		a.leavePending(evicted)
		evicted.stage = stageGone
	case a.pending.Len() >= a.maxPending:
		evicted = a.victim(a.bySource[tc.src])
		if evicted == nil {
			tc.stage = stageGone
			return nil, refuseCapacity
		}
		a.leavePending(evicted)
		evicted.stage = stageGone
	}
	tc.stage = stageIdle
	tc.elem = a.pending.PushBack(tc)
	a.bySource[tc.src]++
	return evicted, ""
}

// victim picks the connection a newcomer from a source already holding
// held pending connections may evict: an idle one without bytes waiting,
// from the source holding the most, the oldest of those; and only from a
// source holding more than the newcomer's, so that a flooder's own
// reconnects take each other's place, never a lone sidecar's. Nil when
// there is none.
func (a *admission) victim(held int) *trackedConn {
	var best *trackedConn
	bestHeld := held
	for e := a.pending.Front(); e != nil; e = e.Next() {
		c := e.Value.(*trackedConn)
		if n := a.bySource[c.src]; n > bestHeld && c.stage == stageIdle && !a.waiting(c.Conn) {
			best, bestHeld = c, n
		}
	}
	return best
}

// oldestIdle is the oldest idle connection of src without bytes waiting.
func (a *admission) oldestIdle(src netip.Addr) *trackedConn {
	for e := a.pending.Front(); e != nil; e = e.Next() {
		if c := e.Value.(*trackedConn); c.src == src && c.stage == stageIdle && !a.waiting(c.Conn) {
			return c
		}
	}
	return nil
}

// authenticating marks that tc's CONNECT was read: it can no longer be
// evicted. False when it was evicted first.
func (a *admission) authenticating(tc *trackedConn) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if tc.stage != stageIdle {
		return false
	}
	tc.stage = stageAuthenticating
	return true
}

// promote moves an authenticated tc from the pending pool to the session
// slot of its pod. It returns the pod's session it replaces, which the
// caller disconnects, or false when every session slot is taken by other
// pods.
func (a *admission) promote(tc *trackedConn, id podsignal.PodID) (replaced *trackedConn, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if tc.stage != stageAuthenticating {
		return nil, false
	}
	a.leavePending(tc)
	replaced = a.sessions[id]
	if replaced == nil && len(a.sessions) >= a.maxSessions {
		tc.stage = stageGone
		return nil, false
	}
	if replaced != nil {
		replaced.stage = stageGone
	}
	tc.stage, tc.id = stageSession, id
	a.sessions[id] = tc
	return replaced, true
}

// release frees whatever tc holds once its connection has ended, and says
// in which stage it ended.
func (a *admission) release(tc *trackedConn) stage {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := tc.stage
	switch st {
	case stageIdle, stageAuthenticating:
		a.leavePending(tc)
	case stageSession:
		if a.sessions[tc.id] == tc {
			delete(a.sessions, tc.id)
		}
	}
	tc.stage = stageGone
	return st
}

func (a *admission) leavePending(tc *trackedConn) {
	if tc.elem == nil {
		return
	}
	a.pending.Remove(tc.elem)
	tc.elem = nil
	if a.bySource[tc.src]--; a.bySource[tc.src] <= 0 {
		delete(a.bySource, tc.src)
	}
}

// counts returns the pending connections and the sessions held.
func (a *admission) counts() (pending, sessions int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pending.Len(), len(a.sessions)
}

// logSampler lets through at most perSecond lines of each kind a second
// and says how many it held back before each one it lets through.
type logSampler struct {
	perSecond int

	mu    sync.Mutex
	kinds map[string]*sampled
}

type sampled struct {
	second     int64 // unix second of the window
	n          int   // lines let through in it
	suppressed int   // held back since the last line let through
}

func (s *logSampler) allow(kind string, now time.Time) (suppressed int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kinds == nil {
		s.kinds = make(map[string]*sampled)
	}
	k := s.kinds[kind]
	if k == nil {
		k = &sampled{}
		s.kinds[kind] = k
	}
	if sec := now.Unix(); sec != k.second {
		k.second, k.n = sec, 0
	}
	if k.n >= s.perSecond {
		k.suppressed++
		return 0, false
	}
	k.n++
	suppressed, k.suppressed = k.suppressed, 0
	return suppressed, true
}
