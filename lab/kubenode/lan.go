package kubenode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"golang.org/x/sys/unix"

	"github.com/amf-edge/amf/lab/controlplane"
)

// The LAN's addresses. Every LAN has the same plan inside its own namespace;
// what the host routes (node and pod addresses, the uplink) is unique per
// node slot and LAN slot, so LANs of concurrent clusters never collide.
const (
	// LANGateway is the LAN's router and the control plane's address on it:
	// the lab relays <LANGateway>:6443 to the API server on loopback.
	LANGateway = "10.215.255.254"
	lanPrefix  = 16 // 10.215.0.0/16; node i is 10.215.<i>.2
	// AllPods covers every node's pod range (10.214.<i>.0/24).
	AllPods = "10.214.0.0/16"
	// Uplinks covers the host–LAN links (10.216.<j>.0/30).
	Uplinks = "10.216.0.0/16"
	// ServiceIPs is the control plane's --service-cluster-ip-range.
	ServiceIPs = "10.96.0.0/16"
	// MaxLANs is how many LANs can run on one machine at once.
	MaxLANs = 16
)

// LAN is a virtual LAN for a cluster of nodes on one machine: a network
// namespace the lab creates, holding a bridge that every node of the cluster
// is plugged into with a veth (its only link), and the control plane's
// address (LANGateway: a relay to the API server on loopback). The host
// reaches the nodes and their pods through an uplink veth into the LAN
// namespace (host end amfl<j>, 10.216.<j>.1), routed only to the addresses
// of this LAN's nodes. The LAN namespace routes between the nodes' pod ranges
// and has a dead-end default route, as every node has.
//
// Everything a node says to the API server, to the other nodes and to the
// host crosses its LAN port, so taking that port down (PowerCut, Partition)
// cuts the node off as a power cut or a pulled cable would: packets are
// dropped without a reset.
//
// A LAN has a slot (/run/amf-lab/kubenode/lan<j>.lock) and a janitor like a
// node's: its namespace's holder process runs in freezer:/amf-lan<j>, and the
// janitor kills it when the lab process ends however, so the namespace, the
// bridge and every veth go with it.
type LAN struct {
	// Index is the LAN's slot on this machine (0 ≤ Index < MaxLANs).
	Index int
	// NetNS is the path of the LAN's network namespace (for DialIn, ListenIn).
	NetNS string
	// Uplink is the host's end of the veth into the LAN (amfl<j>); HostIP its
	// address, the source of the host's traffic to the nodes.
	Uplink, HostIP string

	cp      *controlplane.ControlPlane
	cgroup  string // amf-lan<j>, in the freezer hierarchy
	dir     string
	lanIP   string // the LAN's end of the uplink
	lock    *os.File
	janitor *janitor
	holder  *exec.Cmd
	held    chan struct{}
	relay   *relay
	logf    func(string, ...any)

	stopOnce sync.Once
}

// NewLAN creates a LAN for nodes of cp's cluster and publishes LANGateway as
// the endpoint of the "kubernetes" Service. The caller calls Stop after the
// nodes' Stop; if the caller dies, the LAN's janitor tears it down.
func NewLAN(ctx context.Context, cp *controlplane.ControlPlane, logf func(string, ...any)) (_ *LAN, err error) {
	if cp == nil {
		return nil, errors.New("kubenode: NewLAN needs a control plane")
	}
	if err := Check(); err != nil {
		return nil, err
	}
	if logf == nil {
		logf = func(string, ...any) {}
	}
	l := &LAN{cp: cp, logf: logf, held: make(chan struct{})}
	if err := l.takeIndex(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			l.Stop()
		}
	}()
	if err := l.setup(ctx); err != nil {
		return nil, fmt.Errorf("kubenode LAN %d: %w", l.Index, err)
	}
	return l, nil
}

func (l *LAN) takeIndex() error {
	if err := os.MkdirAll(lockDir, 0o755); err != nil {
		return fmt.Errorf("kubenode: %w", err)
	}
	for j := range MaxLANs {
		f, err := os.OpenFile(filepath.Join(lockDir, fmt.Sprintf("lan%d.lock", j)), os.O_CREATE|os.O_RDWR|syscall.O_CLOEXEC, 0o600)
		if err != nil {
			return fmt.Errorf("kubenode: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		l.Index, l.lock = j, f
		l.cgroup = fmt.Sprintf("amf-lan%d", j)
		l.Uplink = fmt.Sprintf("amfl%d", j)
		l.HostIP = fmt.Sprintf("10.216.%d.1", j)
		l.lanIP = fmt.Sprintf("10.216.%d.2", j)
		return nil
	}
	return fmt.Errorf("kubenode: all %d LAN slots on this machine are taken", MaxLANs)
}

func (l *LAN) setup(ctx context.Context) error {
	if err := cleanStale(l.cgroup, nil); err != nil {
		return err
	}
	var err error
	if l.dir, err = os.MkdirTemp("", l.cgroup+"-"); err != nil {
		return err
	}
	env := []string{"AMF_JANITOR_LINK=" + l.Uplink}
	if l.janitor, err = startJanitor(l.cgroup, -1, []string{l.dir}, l.lock, filepath.Join(lockDir, fmt.Sprintf("lan%d.janitor.log", l.Index)), env); err != nil {
		return err
	}
	cg := filepath.Join("/sys/fs/cgroup/freezer", l.cgroup)
	if err := os.Mkdir(cg, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("cgroup %s: %w", cg, err)
	}
	if err := l.startHolder(ctx, cg); err != nil {
		return err
	}
	if err := l.network(); err != nil {
		return err
	}
	ln, err := ListenIn(l.NetNS, net.JoinHostPort(LANGateway, strconv.Itoa(APIServerPort)))
	if err != nil {
		return fmt.Errorf("API server relay: %w", err)
	}
	l.relay = newRelay(ln, "127.0.0.1:"+strconv.Itoa(l.cp.APIServerPort()))
	return l.publishAPIEndpoint(ctx)
}

// startHolder starts the process whose network namespace is the LAN's.
func (l *LAN) startHolder(ctx context.Context, cg string) error {
	log, err := os.Create(filepath.Join(l.dir, "holder.log"))
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command("/bin/sh", "-c", fmt.Sprintf(`echo $$ >%s/cgroup.procs && exec unshare --net /bin/sh -c 'echo ready; exec sleep infinity'`, cg))
	cmd.Stderr = log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the LAN's namespace holder: %w", err)
	}
	l.holder = cmd
	ready := make(chan error, 1)
	go func() {
		b := make([]byte, 6)
		_, err := io.ReadFull(out, b)
		if err == nil && string(b) != "ready\n" {
			err = fmt.Errorf("said %q", b)
		}
		ready <- err
		_, _ = io.Copy(io.Discard, out)
	}()
	go func() { _ = cmd.Wait(); close(l.held) }()
	select {
	case err := <-ready:
		if err != nil {
			b, _ := os.ReadFile(log.Name())
			return fmt.Errorf("the LAN's namespace holder: %w: %s", err, b)
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	l.NetNS = fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid)
	return nil
}

// in runs a command in the LAN's network namespace.
func (l *LAN) in(args ...string) error {
	return run("nsenter", append([]string{"--target", strconv.Itoa(l.holder.Process.Pid), "--net", "--"}, args...)...)
}

func (l *LAN) network() error {
	pid := strconv.Itoa(l.holder.Process.Pid)
	_ = run("ip", "link", "del", l.Uplink) // a stale one of a dead LAN
	steps := [][]string{
		{"ip", "link", "set", "lo", "up"},
		{"ip", "link", "add", "br0", "type", "bridge"},
		{"ip", "addr", "add", LANGateway + "/" + strconv.Itoa(lanPrefix), "dev", "br0"},
		{"ip", "link", "set", "br0", "up"},
		{"ip", "route", "add", "unreachable", "default"},
		{"sysctl", "-q", "-w", "net.ipv4.ip_forward=1"},
		// It routes between nodes on the same bridge: no redirects to them.
		{"sysctl", "-q", "-w", "net.ipv4.conf.all.send_redirects=0"},
		{"sysctl", "-q", "-w", "net.ipv4.conf.br0.send_redirects=0"},
	}
	for _, s := range steps {
		if err := l.in(s...); err != nil {
			return fmt.Errorf("LAN network: %w", err)
		}
	}
	hostSteps := [][]string{
		{"ip", "link", "add", l.Uplink, "type", "veth", "peer", "name", "up0", "netns", pid},
		{"ip", "addr", "add", l.HostIP + "/30", "dev", l.Uplink},
		{"ip", "link", "set", l.Uplink, "up"},
	}
	for _, s := range hostSteps {
		if err := run(s[0], s[1:]...); err != nil {
			return fmt.Errorf("LAN uplink: %w", err)
		}
	}
	for _, s := range [][]string{
		{"ip", "addr", "add", l.lanIP + "/30", "dev", "up0"},
		{"ip", "link", "set", "up0", "up"},
	} {
		if err := l.in(s...); err != nil {
			return fmt.Errorf("LAN uplink: %w", err)
		}
	}
	return nil
}

// port is the name of node i's port on the LAN's bridge.
func port(i int) string { return fmt.Sprintf("n%d", i) }

// plug connects node n to the LAN: a veth from the bridge (port n<i>) to the
// node's eth0 with its LAN address, and the routes to it from the LAN and the
// host (its address and pod range only).
func (l *LAN) plug(n *Node) error {
	npid := strconv.Itoa(n.holder.cmd.Process.Pid)
	in := func(args ...string) error {
		return run("nsenter", append([]string{"--target", npid, "--net", "--"}, args...)...)
	}
	p := port(n.Index)
	_ = l.in("ip", "link", "del", p) // of an earlier node in this slot
	steps := []func() error{
		func() error {
			return l.in("ip", "link", "add", p, "type", "veth", "peer", "name", "eth0", "netns", npid)
		},
		func() error { return l.in("ip", "link", "set", p, "master", "br0") },
		func() error { return l.in("ip", "link", "set", p, "up") },
		func() error { return l.in("ip", "route", "replace", n.PodCIDR, "via", n.IP, "dev", "br0") },
		func() error { return in("ip", "link", "set", "lo", "up") },
		func() error { return in("ip", "addr", "add", n.IP+"/"+strconv.Itoa(lanPrefix), "dev", "eth0") },
		func() error { return in("ip", "link", "set", "eth0", "up") },
		func() error { return in("ip", "route", "add", AllPods, "via", LANGateway, "dev", "eth0") },
		func() error { return in("ip", "route", "add", Uplinks, "via", LANGateway, "dev", "eth0") },
		// ClusterIPs from the node itself (hostNetwork): routed first, then
		// kube-proxy's OUTPUT rules rewrite them; a ClusterIP no rule knows
		// dies at the LAN's dead-end default.
		func() error { return in("ip", "route", "add", ServiceIPs, "via", LANGateway, "dev", "eth0") },
		func() error { return in("ip", "route", "add", "unreachable", "default") },
		func() error { return in("sysctl", "-q", "-w", "net.ipv4.ip_forward=1") },
		func() error { return in("sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1") },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return fmt.Errorf("plug %s into LAN %d: %w", n.Name, l.Index, err)
		}
	}
	for _, r := range l.hostRoutes(n) {
		if err := run("ip", append([]string{"route", "replace"}, r...)...); err != nil {
			return fmt.Errorf("plug %s into LAN %d: %w", n.Name, l.Index, err)
		}
	}
	return nil
}

// hostRoutes are the host's routes to node n through the uplink.
func (l *LAN) hostRoutes(n *Node) [][]string { return l.routesTo(n.IP, n.PodCIDR) }

// routesTo are the host's routes through the uplink to a node at ip with
// pods in podCIDR.
func (l *LAN) routesTo(ip, podCIDR string) [][]string {
	return [][]string{
		{ip + "/32", "via", l.lanIP, "dev", l.Uplink},
		{podCIDR, "via", l.lanIP, "dev", l.Uplink},
	}
}

// setPort takes node i's LAN port down or up. The node's end loses its
// carrier: its routes stay, and what it sends is dropped, as on a cut cable.
func (l *LAN) setPort(i int, up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	if err := l.in("ip", "link", "set", port(i), state); err != nil {
		return fmt.Errorf("LAN %d: port of node slot %d %s: %w", l.Index, i, state, err)
	}
	return nil
}

// publishAPIEndpoint makes LANGateway the "kubernetes" Service's endpoint, so
// pods on every node reach the API server across the LAN (the nodes publish
// none of their own in a LAN).
func (l *LAN) publishAPIEndpoint(ctx context.Context) error {
	c := l.cp.Client()
	name := fmt.Sprintf("kubernetes-lan%d", l.Index)
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: metav1.NamespaceDefault,
			Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes", discoveryv1.LabelManagedBy: "amf-lab-kubenode"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{LANGateway}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(int32(APIServerPort)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	_, err := c.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).Create(ctx, es, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		_, err = c.DiscoveryV1().EndpointSlices(metav1.NamespaceDefault).Update(ctx, es, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("EndpointSlice %s for the kubernetes Service: %w", name, err)
	}
	return nil
}

// Stop tears the LAN down (after its nodes) and waits: the relay and its
// connections close (a socket would keep the namespace alive), the janitor
// kills the holder, and the namespace, bridge, veths and host routes go.
func (l *LAN) Stop() {
	l.stopOnce.Do(func() {
		if l.relay != nil {
			l.relay.Close()
		}
		if l.janitor != nil {
			l.janitor.run()
		}
		if l.holder != nil {
			<-l.held
		}
		if l.lock != nil {
			l.lock.Close()
		}
	})
}

// relay forwards every connection its listener accepts to target, and closes
// them all at Close.
type relay struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

func newRelay(ln net.Listener, target string) *relay {
	r := &relay{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go r.serve(c)
		}
	}()
	return r
}

func (r *relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		c.Close()
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *relay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	c.Close()
}

func (r *relay) serve(c net.Conn) {
	// Closed with a reset, never left to linger in FIN-WAIT: an orphaned
	// socket holds its network namespace, and with it the namespace's links,
	// for minutes after the lab process is gone (its peer may be a node that
	// is frozen or already torn down).
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	if !r.track(c) {
		return
	}
	defer r.untrack(c)
	u, err := net.DialTimeout("tcp", r.target, 5*time.Second)
	if err != nil {
		return
	}
	if !r.track(u) {
		return
	}
	defer r.untrack(u)
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(u, c)
	go cp(c, u)
	<-done
	<-done
}

// Close stops accepting and closes every connection.
func (r *relay) Close() {
	r.mu.Lock()
	r.closed = true
	conns := make([]net.Conn, 0, len(r.conns))
	for c := range r.conns {
		conns = append(conns, c)
	}
	r.mu.Unlock()
	r.ln.Close()
	for _, c := range conns {
		c.Close()
	}
}
