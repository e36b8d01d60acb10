package connkill

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The agent holds no capability; Kill needs two. So Kill runs in a small
// process of its own beside the agent (amf-agent connkill), which answers
// one question on a Unix socket, from one user: "end the flows to these
// endpoints". It reads nothing else and touches nothing else.

// request is one question: the dead endpoints, "ip:port".
type request struct {
	Dead []string `json:"dead"`
}

// reply is what Kill did, or why it could not.
type reply struct {
	Flows      int    `json:"flows"`
	Sockets    int    `json:"sockets"`
	Conntrack  int    `json:"conntrack"`
	Namespaces int    `json:"namespaces"`
	Error      string `json:"error,omitempty"`
}

// MaxEndpoints bounds one request: a pod has a few ports.
const MaxEndpoints = 64

// maxRequestBytes bounds a request line.
const maxRequestBytes = 4 << 10

// Serve answers the requests on ln, a Unix socket, with k until ctx ends,
// from the user uid only (the peer's credentials, SO_PEERCRED); the others
// are closed unanswered and logged. One request at a time: Kill walks the
// node's namespaces, and two at once would only contend.
func Serve(ctx context.Context, ln *net.UnixListener, k Killer, uid int, log *slog.Logger) error {
	var one sync.Mutex
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("connkill: accept: %w", err)
		}
		go func() {
			defer c.Close()
			peer, err := peerUID(c)
			if err != nil || peer != uid {
				log.Warn("connkill: a request from another user refused", slog.Int("uid", peer), slog.Int("want_uid", uid), slog.Any("error", err))
				return
			}
			_ = c.SetDeadline(time.Now().Add(30 * time.Second))
			r := answer(ctx, c, k, &one)
			if r.Error != "" {
				log.Warn("connkill: request not done", slog.String("error", r.Error))
			} else {
				log.Info("connkill: connections ended", slog.Int("flows", r.Flows), slog.Int("sockets", r.Sockets), slog.Int("conntrack", r.Conntrack), slog.Int("namespaces", r.Namespaces))
			}
			_ = json.NewEncoder(c).Encode(r)
		}()
	}
}

func answer(ctx context.Context, c net.Conn, k Killer, one *sync.Mutex) reply {
	line, err := bufio.NewReaderSize(c, maxRequestBytes).ReadSlice('\n')
	if err != nil {
		return reply{Error: fmt.Sprintf("read the request (one JSON line of at most %d bytes): %v", maxRequestBytes, err)}
	}
	var req request
	if err := json.Unmarshal(line, &req); err != nil {
		return reply{Error: fmt.Sprintf("request: %v", err)}
	}
	dead, err := parseEndpoints(req.Dead)
	if err != nil {
		return reply{Error: err.Error()}
	}
	one.Lock()
	defer one.Unlock()
	res, err := k.Kill(ctx, dead)
	r := reply{Flows: len(res.Flows), Sockets: res.Sockets, Conntrack: res.Conntrack, Namespaces: res.Namespaces}
	if err != nil {
		r.Error = err.Error()
	}
	return r
}

func parseEndpoints(ss []string) ([]netip.AddrPort, error) {
	if len(ss) == 0 || len(ss) > MaxEndpoints {
		return nil, fmt.Errorf("request: %d endpoints, want 1 to %d", len(ss), MaxEndpoints)
	}
	dead := make([]netip.AddrPort, 0, len(ss))
	for _, s := range ss {
		a, err := netip.ParseAddrPort(s)
		if err != nil || !a.Addr().Is4() || a.Port() == 0 {
			return nil, fmt.Errorf("request: endpoint %q: want an IPv4 ip:port", s)
		}
		dead = append(dead, a)
	}
	return dead, nil
}

func peerUID(c *net.UnixConn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return -1, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return -1, err
	}
	if cerr != nil {
		return -1, cerr
	}
	return int(cred.Uid), nil
}

// Client asks the process at Socket (Serve) to end the flows to dead
// endpoints.
type Client struct {
	Socket string
}

// ErrRefused is wrapped by a request the server did not carry out.
var ErrRefused = errors.New("connkill: refused")

// Kill sends one request and returns the server's counts.
func (cl Client) Kill(ctx context.Context, dead []netip.AddrPort) (flows, sockets int, err error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", cl.Socket)
	if err != nil {
		return 0, 0, fmt.Errorf("connkill: %w", err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	req := request{}
	for _, a := range dead {
		req.Dead = append(req.Dead, a.String())
	}
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return 0, 0, fmt.Errorf("connkill: send: %w", err)
	}
	var r reply
	if err := json.NewDecoder(c).Decode(&r); err != nil {
		return 0, 0, fmt.Errorf("connkill: no answer (refused, or the server stopped): %w", err)
	}
	if r.Error != "" {
		return r.Flows, r.Sockets, fmt.Errorf("%w: %s", ErrRefused, r.Error)
	}
	return r.Flows, r.Sockets, nil
}
