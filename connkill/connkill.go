// Package connkill ends at once the TCP connections that a node holds to a
// broker pod that is gone, so that each client gets an error now and
// reconnects, instead of waiting out its own keep-alive (DESIGN.md, "The
// clients of a lost broker").
//
// A client of a broker on a node that lost its power holds a connection to
// an address that never answers again: no FIN, no reset. It notices only when
// its library gives up: paho's Go client ≈ 40 s after its last packet at a
// 30 s keep-alive, libmosquitto's not at all for minutes. The node that holds
// the client's side can end it now:
//
//  1. The node's connection tracking (the Service NAT of kube-proxy, or a
//     plain forward) knows every flow through it to the dead endpoint: its
//     reply comes from the dead pod's address. The flow's original tuple is
//     what the client's socket sees (its own address and the Service's, or
//     the pod's when it dialled the pod).
//  2. That socket is in the network namespace of a pod on this node, or in
//     the node's own: it is destroyed there (SOCK_DESTROY, the kernel's
//     inet_diag). The kernel sends a reset to the peer and fails the
//     client's next read or write with ECONNABORTED, which every MQTT
//     library treats as a lost connection: it reconnects, through the
//     Service, to the new primary.
//  3. The flow's conntrack entry is deleted, so that a client whose socket
//     is elsewhere (outside the cluster, through a NodePort) is NATed anew at
//     its next packet, to a pod that answers it with a reset.
//
// Nothing else is touched: only flows whose reply comes from a dead endpoint,
// and only the sockets those flows name. It needs CAP_NET_ADMIN (conntrack,
// SOCK_DESTROY) and, to reach the pods' namespaces, CAP_SYS_ADMIN (setns) and
// their namespace files; IPv4 only (the netlink library destroys IPv4
// sockets only).
package connkill

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"

	"github.com/amf-edge/amf/netns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Flow is one connection through the node to a dead endpoint, as the
// client's socket sees it.
type Flow struct {
	Client  netip.AddrPort // the client's own address
	Dialled netip.AddrPort // what it dialled: a Service, a NodePort, the pod
	Dead    netip.AddrPort // the endpoint that answered it
}

// Result is what Kill did.
type Result struct {
	Flows      []Flow // found in the node's conntrack
	Sockets    int    // of those, the client sockets destroyed on this node
	Conntrack  int    // conntrack entries deleted
	Namespaces int    // network namespaces searched for the sockets
}

// Killer ends the connections of one node to dead endpoints.
type Killer struct {
	// HostNetns is the path of the node's network namespace, where its
	// conntrack table is; "" is the caller's (the agent runs in it).
	HostNetns string
	// Namespaces lists the network namespaces of the node's pods, by path
	// (ListNetns reads the runtime's folder).
	Namespaces func() ([]string, error)
}

// Kill ends every connection of the node whose reply comes from one of
// dead, and returns what it did. A namespace that vanishes meanwhile (its
// pod ended) is skipped; the first error that stops a step is returned with
// what was done.
func (k Killer) Kill(ctx context.Context, dead []netip.AddrPort) (Result, error) {
	var res Result
	if len(dead) == 0 {
		return res, nil
	}
	err := k.inHost(func() error {
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
		if err != nil {
			return fmt.Errorf("conntrack: list: %w", err)
		}
		for _, f := range flows {
			if fl, ok := match(f, dead); ok {
				res.Flows = append(res.Flows, fl)
			}
		}
		return nil
	})
	if err != nil || len(res.Flows) == 0 {
		return res, err
	}
	// The node's own sockets (host-network clients, the agent's own), then
	// each pod's.
	left := slices.Clone(res.Flows)
	left, n, err := destroyIn(k.HostNetns, left)
	res.Sockets += n
	res.Namespaces++
	if err != nil {
		return res, err
	}
	if len(left) > 0 && k.Namespaces != nil {
		paths, err := k.Namespaces()
		if err != nil {
			return res, fmt.Errorf("pods' network namespaces: %w", err)
		}
		for _, p := range paths {
			if len(left) == 0 || ctx.Err() != nil {
				break
			}
			var n int
			left, n, err = destroyIn(p, left)
			if errors.Is(err, os.ErrNotExist) {
				continue // the pod ended meanwhile
			}
			if err != nil {
				return res, err
			}
			res.Sockets += n
			res.Namespaces++
		}
	}
	err = k.inHost(func() error {
		n, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, deadFilter(dead))
		res.Conntrack = int(n)
		if err != nil {
			return fmt.Errorf("conntrack: delete: %w", err)
		}
		return nil
	})
	return res, err
}

// match is f as a Flow when its reply comes from a dead TCP endpoint.
func match(f *netlink.ConntrackFlow, dead []netip.AddrPort) (Flow, bool) {
	if f.Forward.Protocol != unix.IPPROTO_TCP {
		return Flow{}, false
	}
	from, ok := addrPort(f.Reverse.SrcIP, f.Reverse.SrcPort)
	if !ok || !slices.Contains(dead, from) {
		return Flow{}, false
	}
	client, ok1 := addrPort(f.Forward.SrcIP, f.Forward.SrcPort)
	dialled, ok2 := addrPort(f.Forward.DstIP, f.Forward.DstPort)
	if !ok1 || !ok2 {
		return Flow{}, false
	}
	return Flow{Client: client, Dialled: dialled, Dead: from}, true
}

func addrPort(ip net.IP, port uint16) (netip.AddrPort, bool) {
	a, ok := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(a.Unmap(), port), ok
}

// deadFilter matches the conntrack entries of TCP flows answered by a dead
// endpoint.
type deadFilter []netip.AddrPort

func (d deadFilter) MatchConntrackFlow(f *netlink.ConntrackFlow) bool {
	_, ok := match(f, d)
	return ok
}

// destroyIn destroys, in the network namespace at path ("" the caller's),
// the client sockets of flows that are there, and returns the flows left.
func destroyIn(path string, flows []Flow) (left []Flow, destroyed int, err error) {
	err = netns.Run(path, func() error {
		for _, f := range flows {
			local := net.TCPAddrFromAddrPort(f.Client)
			remote := net.TCPAddrFromAddrPort(f.Dialled)
			switch err := netlink.SocketDestroy(local, remote); {
			case err == nil:
				destroyed++
			case errors.Is(err, unix.ENOENT):
				left = append(left, f) // not in this namespace
			default:
				return fmt.Errorf("destroy the socket %s → %s: %w", f.Client, f.Dialled, err)
			}
		}
		return nil
	})
	return left, destroyed, err
}

func (k Killer) inHost(f func() error) error { return netns.Run(k.HostNetns, f) }

// NetnsDir is where containerd's CNI setup keeps the pods' network
// namespaces (CRI-O's too).
const NetnsDir = "/var/run/netns"

// ListNetns lists the network namespace files in dir (NetnsDir in a pod
// that mounts the host's); a missing dir is no namespace.
func ListNetns(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var paths []string
	for _, e := range ents {
		if !e.IsDir() {
			paths = append(paths, dir+"/"+e.Name())
		}
	}
	return paths, nil
}
