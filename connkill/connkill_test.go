package connkill_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/amf-edge/amf/connkill"
	"github.com/amf-edge/amf/netns"
)

// netnsOf starts a process holding a new network namespace, killed with
// the test (and with the test binary: Pdeathsig), and returns its path.
func netnsOf(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("unshare", "--net", "--", "sleep", "infinity")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("unshare: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	path := fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid)
	for { // unshare has made the namespace once the link differs from ours
		if l, err := os.Readlink(path); err == nil && l != self {
			return path
		}
		select {
		case <-time.After(5 * time.Millisecond):
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		}
	}
}

func in(t *testing.T, ns string, args ...string) {
	t.Helper()
	out, err := exec.Command("nsenter", append([]string{"--net=" + ns, "--"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// node is a node's network as the test builds it: the node's namespace
// with a Service NAT (10.96.0.10:1883 to the broker), a client pod's, the
// broker pod's and another server's, each on a veth to the node. Nothing
// has a way out: the node's default route is unreachable.
type node struct {
	host, client, broker, other string
}

const (
	service   = "10.96.0.10:1883"
	brokerIP  = "10.70.2.2"
	otherAddr = "10.70.3.2:1883"
)

func newNode(t *testing.T) node {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, veths, iptables")
	}
	for _, bin := range []string{"unshare", "nsenter", "ip", "iptables"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("needs %s (make deps)", bin)
		}
	}
	n := node{host: netnsOf(t), client: netnsOf(t), broker: netnsOf(t), other: netnsOf(t)}
	in(t, n.host, "ip", "link", "set", "lo", "up")
	in(t, n.host, "ip", "route", "add", "unreachable", "default")
	in(t, n.host, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	for i, pod := range []string{n.client, n.broker, n.other} {
		subnet := fmt.Sprintf("10.70.%d", i+1)
		hostEnd, podEnd := fmt.Sprintf("n%d", i), fmt.Sprintf("p%d", i)
		pid := strings.Split(pod, "/")[2]
		in(t, n.host, "ip", "link", "add", hostEnd, "type", "veth", "peer", "name", podEnd, "netns", pid)
		in(t, n.host, "ip", "addr", "add", subnet+".1/24", "dev", hostEnd)
		in(t, n.host, "ip", "link", "set", hostEnd, "up")
		in(t, pod, "ip", "link", "set", "lo", "up")
		in(t, pod, "ip", "addr", "add", subnet+".2/24", "dev", podEnd)
		in(t, pod, "ip", "link", "set", podEnd, "up")
		in(t, pod, "ip", "route", "add", "default", "via", subnet+".1")
	}
	in(t, n.host, "iptables", "-t", "nat", "-A", "PREROUTING", "-d", "10.96.0.10", "-p", "tcp", "--dport", "1883",
		"-j", "DNAT", "--to-destination", brokerIP+":1883")
	return n
}

// connect serves the broker's address with echo and returns the client
// pod's connection to it through the Service, proven by a round trip.
func (n node) connect(t *testing.T) net.Conn {
	t.Helper()
	ln, err := netns.Listen(n.broker, brokerIP+":1883")
	if err != nil {
		t.Fatal(err)
	}
	echo(t, ln)
	c, err := netns.Dial(t.Context(), n.client, service)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := roundTrip(c, "hello"); err != nil {
		t.Fatal(err)
	}
	return c
}

// echo serves ln: each connection gets its lines back.
func echo(t *testing.T, ln net.Listener) {
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
}

func roundTrip(c net.Conn, line string) error {
	if err := c.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return err
	}
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if got != line+"\n" {
		return fmt.Errorf("echo %q, want %q", got, line)
	}
	return c.SetDeadline(time.Time{})
}

// TestAClientOfALostBrokerIsCutOffAtOnceAndNothingElseIs: a client pod's
// connection to a broker through a Service NAT hangs once the broker's pod
// is unreachable (its link down: what a power cut looks like from here);
// Kill with the broker's endpoint fails the client's blocked read at once
// with ECONNABORTED and removes the NAT's entry, while the same pod's
// connection to another server goes on, and a second Kill finds nothing.
func TestAClientOfALostBrokerIsCutOffAtOnceAndNothingElseIs(t *testing.T) {
	n := newNode(t)
	ctx := t.Context()
	for ns, addr := range map[string]string{n.broker: brokerIP + ":1883", n.other: otherAddr} {
		ln, err := netns.Listen(ns, addr)
		if err != nil {
			t.Fatal(err)
		}
		echo(t, ln)
	}
	toBroker, err := netns.Dial(ctx, n.client, service)
	if err != nil {
		t.Fatal(err)
	}
	defer toBroker.Close()
	toOther, err := netns.Dial(ctx, n.client, otherAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer toOther.Close()
	for _, c := range []net.Conn{toBroker, toOther} {
		if err := roundTrip(c, "hello"); err != nil {
			t.Fatal(err)
		}
	}

	in(t, n.broker, "ip", "link", "set", "p1", "down")
	read := make(chan error, 1)
	go func() {
		_, err := toBroker.Read(make([]byte, 1))
		read <- err
	}()
	select {
	case err := <-read:
		t.Fatalf("the read ended before Kill: %v", err)
	case <-time.After(200 * time.Millisecond): // a read that would hang: the point of Kill
	}

	dead := netip.MustParseAddrPort(brokerIP + ":1883")
	k := connkill.Killer{HostNetns: n.host, Namespaces: func() ([]string, error) { return []string{n.other, n.client}, nil }}
	start := time.Now()
	res, err := k.Kill(ctx, []netip.AddrPort{dead})
	if err != nil {
		t.Fatal(err)
	}
	client := netip.MustParseAddrPort(toBroker.LocalAddr().String())
	want := connkill.Flow{Client: client, Dialled: netip.MustParseAddrPort(service), Dead: dead}
	if len(res.Flows) != 1 || res.Flows[0] != want || res.Sockets != 1 || res.Conntrack != 1 {
		t.Errorf("result %+v, want the one flow %+v, its socket and its conntrack entry", res, want)
	}
	select {
	case err := <-read:
		if !errors.Is(err, syscall.ECONNABORTED) {
			t.Errorf("the client's read ended with %v, want ECONNABORTED", err)
		}
		t.Logf("the client's read ended %v after Kill began: %v", time.Since(start).Round(time.Microsecond), err)
	case <-time.After(5 * time.Second):
		t.Fatal("the client's read still hangs 5 s after Kill")
	}
	if err := roundTrip(toOther, "still there"); err != nil {
		t.Errorf("the pod's other connection: %v", err)
	}
	again, err := k.Kill(ctx, []netip.AddrPort{dead})
	if err != nil || len(again.Flows) != 0 || again.Sockets != 0 || again.Conntrack != 0 {
		t.Errorf("a second Kill: %+v, %v; want nothing found", again, err)
	}
}

// TestKillSkipsANamespaceThatIsGone: a pod that ended while Kill ran is
// skipped, and the flow's entry still goes.
func TestKillSkipsANamespaceThatIsGone(t *testing.T) {
	n := newNode(t)
	n.connect(t)
	gone := filepath.Join(t.TempDir(), "netns-of-an-ended-pod")
	k := connkill.Killer{HostNetns: n.host, Namespaces: func() ([]string, error) { return []string{gone}, nil }}
	res, err := k.Kill(t.Context(), []netip.AddrPort{netip.MustParseAddrPort(brokerIP + ":1883")})
	if err != nil || len(res.Flows) != 1 || res.Sockets != 0 || res.Conntrack != 1 {
		t.Errorf("result %+v, %v; want the flow found, no socket, its entry deleted", res, err)
	}
}

func TestListNetnsListsTheFilesOfTheFolder(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"cni-1", "cni-2"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	got, err := connkill.ListNetns(dir)
	if err != nil || len(got) != 2 || got[0] != filepath.Join(dir, "cni-1") || got[1] != filepath.Join(dir, "cni-2") {
		t.Errorf("ListNetns = %q, %v", got, err)
	}
	if got, err := connkill.ListNetns(filepath.Join(dir, "none")); err != nil || got != nil {
		t.Errorf("a missing folder: %q, %v; want none", got, err)
	}
}

// serveOn starts Serve on a socket in a temporary folder for uid.
func serveOn(t *testing.T, k connkill.Killer, uid int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "connkill.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- connkill.Serve(ctx, ln, k, uid, slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return path
}

// TestTheServerEndsTheFlowsItIsAskedForByItsUserOnly: the agent's side of
// the socket gets Kill's counts; a request from another user is closed
// unanswered, and a malformed one is answered with the reason.
func TestTheServerEndsTheFlowsItIsAskedForByItsUserOnly(t *testing.T) {
	n := newNode(t)
	c := n.connect(t)
	k := connkill.Killer{HostNetns: n.host, Namespaces: func() ([]string, error) { return []string{n.client}, nil }}
	dead := []netip.AddrPort{netip.MustParseAddrPort(brokerIP + ":1883")}

	other := connkill.Client{Socket: serveOn(t, k, os.Getuid()+4242)}
	if _, _, err := other.Kill(t.Context(), dead); err == nil || errors.Is(err, connkill.ErrRefused) {
		t.Errorf("a request from another user: %v, want it closed unanswered", err)
	}
	if err := roundTrip(c, "untouched"); err != nil {
		t.Fatalf("the connection after a refused request: %v", err)
	}

	mine := connkill.Client{Socket: serveOn(t, k, os.Getuid())}
	flows, sockets, err := mine.Kill(t.Context(), dead)
	if err != nil || flows != 1 || sockets != 1 {
		t.Errorf("Kill through the server: %d flows, %d sockets, %v; want 1, 1", flows, sockets, err)
	}
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, syscall.ECONNABORTED) {
		t.Errorf("the client's read: %v, want ECONNABORTED", err)
	}
	if _, _, err := mine.Kill(t.Context(), []netip.AddrPort{netip.MustParseAddrPort("[::1]:1883")}); !errors.Is(err, connkill.ErrRefused) || !strings.Contains(err.Error(), "want an IPv4 ip:port") {
		t.Errorf("an IPv6 endpoint: %v, want refused with the reason", err)
	}
	if _, _, err := mine.Kill(t.Context(), nil); !errors.Is(err, connkill.ErrRefused) || !strings.Contains(err.Error(), "0 endpoints") {
		t.Errorf("no endpoint: %v, want refused with the reason", err)
	}
}

// TestAReconnectStillNATedToTheDeadBrokerIsFailedAtOnce: a client that
// reconnects before the node's Service NAT has dropped the dead endpoint
// (kube-proxy applies an EndpointSlice change up to a second late) sends
// its SYN to an address that never answers, and its connect hangs until
// its own timeout. A later Kill (the Watcher's sweeps, DefaultAgain) finds
// that half-open flow by its NAT entry and fails the connect at once.
func TestAReconnectStillNATedToTheDeadBrokerIsFailedAtOnce(t *testing.T) {
	n := newNode(t)
	n.connect(t)
	in(t, n.broker, "ip", "link", "set", "p1", "down")
	dead := netip.MustParseAddrPort(brokerIP + ":1883")
	k := connkill.Killer{HostNetns: n.host, Namespaces: func() ([]string, error) { return []string{n.client}, nil }}
	if _, err := k.Kill(t.Context(), []netip.AddrPort{dead}); err != nil {
		t.Fatal(err)
	}

	dctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	dialled := make(chan error, 1)
	go func() {
		c, err := netns.Dial(dctx, n.client, service)
		if err == nil {
			c.Close()
		}
		dialled <- err
	}()
	// The SYN is on its way once the NAT holds its flow: sweep until a
	// sweep finds it (each is what one of the Watcher's later sweeps does).
	var res connkill.Result
	for res.Sockets == 0 {
		select {
		case err := <-dialled:
			t.Fatalf("the connect to a dead endpoint ended before a sweep found it: %v", err)
		case <-dctx.Done():
			t.Fatal("no sweep found the connect's flow")
		default:
		}
		var err error
		if res, err = k.Kill(t.Context(), []netip.AddrPort{dead}); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	select {
	case err := <-dialled:
		if !errors.Is(err, syscall.ECONNABORTED) {
			t.Errorf("the connect ended with %v, want ECONNABORTED", err)
		}
		t.Logf("the connect ended %v after the sweep: %v", time.Since(start).Round(time.Microsecond), err)
	case <-dctx.Done():
		t.Fatal("the connect still hangs after the sweep destroyed its socket")
	}
	if len(res.Flows) != 1 || res.Flows[0].Dialled != netip.MustParseAddrPort(service) || res.Conntrack != 1 {
		t.Errorf("the sweep: %+v, want the one flow through the Service and its entry", res)
	}
}
