package kubenode

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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
	"github.com/amf-edge/amf/lab/proc"
)

// MaxNodes is how many nodes can run on one machine at once (each takes an
// index: its subnets, veth and cgroup root).
const MaxNodes = 16

// lockDir holds each slot's lock and its janitor's last log (what a teardown
// could not remove says so there).
const lockDir = "/run/amf-lab/kubenode"

// APIServerPort is where a node's relay serves the API server, on its node IP.
const APIServerPort = 6443

// Environment variables read by this package.
const (
	// EnvRequire, set to 1, turns a missing node prerequisite into a test failure.
	EnvRequire = "AMF_REQUIRE_NODE"
)

// ServingIPs are the addresses lab nodes reach the API server at (their relays):
// pass them as controlplane.Options.ServingIPs so its certificate is valid there.
func ServingIPs() []net.IP {
	ips := make([]net.IP, MaxNodes, MaxNodes+1)
	for i := range ips {
		ips[i] = net.IPv4(10, 213, byte(i), 2)
	}
	return append(ips, net.ParseIP(LANGateway))
}

// Config configures Launch.
type Config struct {
	// Name is the Node's name (default amf-node-<index>).
	Name string
	// ControlPlane is the cluster to join.
	ControlPlane *controlplane.ControlPlane
	// Images are image archives to import into containerd before the kubelet
	// starts (none can be pulled); one of them must be PauseImage.
	Images []string
	// PauseImage is the sandbox image (default amf.lab/pause:v1).
	PauseImage string
	// MaxRestartBackoff caps the kubelet's crash-loop back-off (default: the
	// kubelet's, 5 min), for tests that crash a container often.
	MaxRestartBackoff time.Duration
	// BinDir holds kubelet and kube-proxy (default: the control plane's).
	BinDir string
	// CNIBinDir holds the CNI plugins (default /usr/lib/cni, Debian's).
	CNIBinDir string
	// Log receives progress lines (default: none).
	Log func(format string, args ...any)
	// LAN, if set, is the cluster's LAN to plug the node into (see LAN): its
	// only link, through which it reaches the API server, the other nodes and
	// the host. Without one the node has a veth to the host and a relay of its
	// own, and the link faults (PowerCut, Partition) are refused.
	LAN *LAN
}

// Node is a running node.
type Node struct {
	// Name is the Node's name; IP its InternalIP; PodCIDR its pods' range.
	Name, IP, PodCIDR string
	// Index is the node's slot on this machine (0 ≤ Index < MaxNodes).
	Index int
	// Cgroup is the kubelet's cgroup root, without the leading slash (amf-node<i>).
	Cgroup string
	// Dir holds the node's files (configs, containerd's images, kubelet's
	// state, logs/<component>.log); removed at Stop.
	Dir string
	// Socket is containerd's socket (for ctr --address).
	Socket string
	// NetNS is the path of the node's network namespace (/proc/<pid>/ns/net),
	// for DialIn and ListenIn; valid while the node runs.
	NetNS string
	// KubeletVersion and RuntimeVersion are what the Node reports.
	KubeletVersion, RuntimeVersion string

	cfg        Config
	runDir     string // short paths (sockets): /run/amf-node<i>
	podGateway string
	hostIP     string // the host's end of the veth
	lock       *os.File
	janitor    *janitor
	relay      *relay

	restartMu sync.Mutex // RestartDaemon, one at a time

	mu       sync.Mutex
	holder   *daemon
	daemons  map[string]*daemon
	stopped  bool
	fault    faultState
	stopOnce sync.Once
}

// faultState is what faults the node has now (faults.go).
type faultState struct {
	frozen, linkDown, starved, inboundCut bool
	down                                  map[string]bool // daemons StopDaemon stopped
}

// Launch starts a node and returns once it is Ready. The caller calls Stop;
// if the caller dies instead, the node's janitor tears it down.
func Launch(ctx context.Context, cfg Config) (_ *Node, err error) {
	if cfg.ControlPlane == nil {
		return nil, errors.New("kubenode: Config.ControlPlane is required")
	}
	if err := Check(); err != nil {
		return nil, err
	}
	if cfg.PauseImage == "" {
		cfg.PauseImage = defaultPauseImage
	}
	if cfg.BinDir == "" {
		cfg.BinDir = cfg.ControlPlane.BinDir
	}
	if cfg.CNIBinDir == "" {
		cfg.CNIBinDir = "/usr/lib/cni"
	}
	if cfg.Log == nil {
		cfg.Log = func(string, ...any) {}
	}
	for _, b := range []string{"kubelet", "kube-proxy"} {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil {
			return nil, fmt.Errorf("kubenode: %s not built (%w): run make k8s", b, err)
		}
	}
	n := &Node{cfg: cfg, daemons: map[string]*daemon{}, fault: faultState{down: map[string]bool{}}}
	if err := n.takeIndex(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			n.dumpLogs()
			n.Stop()
		}
	}()
	t0 := time.Now()
	if err := n.setup(ctx); err != nil {
		return nil, fmt.Errorf("kubenode %s: %w", n.Name, err)
	}
	cfg.Log("kubenode: %s Ready in %v (kubelet %s, %s, node IP %s, pods %s, cgroup root /%s)",
		n.Name, time.Since(t0).Round(time.Millisecond), n.KubeletVersion, n.RuntimeVersion, n.IP, n.PodCIDR, n.Cgroup)
	return n, nil
}

// Check says what this machine lacks to run a node, or nil.
func Check() error {
	if os.Geteuid() != 0 {
		return errors.New("kubenode: a node needs root (namespaces, cgroups, containerd)")
	}
	var missing []string
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "ip", "iptables", "nsenter", "unshare"} {
		if _, err := exec.LookPath(b); err != nil {
			missing = append(missing, b)
		}
	}
	for _, p := range []string{"bridge", "host-local", "portmap", "loopback"} {
		if _, err := os.Stat(filepath.Join("/usr/lib/cni", p)); err != nil {
			missing = append(missing, "CNI plugin "+p)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("kubenode: missing %s: run make deps", strings.Join(missing, ", "))
	}
	if _, err := os.Stat("/sys/fs/cgroup/memory/cgroup.procs"); err != nil {
		return fmt.Errorf("kubenode: needs the cgroup v1 memory hierarchy at /sys/fs/cgroup/memory: %w", err)
	}
	return nil
}

// CgroupMode names the node's cgroup hierarchy and driver: the host's (v1 or
// v2, by the file system at /sys/fs/cgroup) and cgroupfs, the driver the
// lab's kubelet and containerd use under the node's own cgroup root.
func (n *Node) CgroupMode() (version, driver string) {
	version = "v1"
	var fs unix.Statfs_t
	if unix.Statfs("/sys/fs/cgroup", &fs) == nil && fs.Type == unix.CGROUP2_SUPER_MAGIC {
		version = "v2"
	}
	return version, "cgroupfs"
}

// takeIndex locks the first free slot. The lock is held by this process and
// the node's janitor, so a slot is free again only once its teardown is done.
func (n *Node) takeIndex() error {
	i, f, err := lockSlot()
	if err != nil {
		return err
	}
	n.Index, n.lock = i, f
	n.Cgroup = fmt.Sprintf("amf-node%d", i)
	n.IP = fmt.Sprintf("10.213.%d.2", i)
	n.hostIP = fmt.Sprintf("10.213.%d.1", i)
	if n.cfg.LAN != nil {
		n.IP = fmt.Sprintf("10.215.%d.2", i)
		n.hostIP = ""
	}
	n.PodCIDR = fmt.Sprintf("10.214.%d.0/24", i)
	n.podGateway = fmt.Sprintf("10.214.%d.1", i)
	n.runDir = fmt.Sprintf("/run/amf-node%d", i)
	n.Socket = filepath.Join(n.runDir, "containerd.sock")
	n.Name = n.cfg.Name
	if n.Name == "" {
		n.Name = fmt.Sprintf("amf-node-%d", i)
	}
	return nil
}

// lockSlot locks the first free node slot and returns it with its lock.
func lockSlot() (int, *os.File, error) {
	if err := os.MkdirAll(lockDir, 0o755); err != nil {
		return 0, nil, fmt.Errorf("kubenode: %w", err)
	}
	for i := range MaxNodes {
		f, err := os.OpenFile(filepath.Join(lockDir, strconv.Itoa(i)+".lock"), os.O_CREATE|os.O_RDWR|syscall.O_CLOEXEC, 0o600)
		if err != nil {
			return 0, nil, fmt.Errorf("kubenode: %w", err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		return i, f, nil
	}
	return 0, nil, fmt.Errorf("kubenode: all %d node slots on this machine are taken", MaxNodes)
}

func (n *Node) path(elem ...string) string {
	return filepath.Join(append([]string{n.Dir}, elem...)...)
}

func (n *Node) runPath(elem ...string) string {
	return filepath.Join(append([]string{n.runDir}, elem...)...)
}

func (n *Node) setup(ctx context.Context) error {
	// A slot's earlier user may have died with its janitor (kill -9 of both):
	// its cgroups and run folder are ours to clean, since we hold the lock.
	if err := cleanStale(n.Cgroup, []string{n.runDir}); err != nil {
		return err
	}
	var err error
	if n.Dir, err = os.MkdirTemp("", n.Cgroup+"-"); err != nil {
		return err
	}
	if err := os.Chmod(n.Dir, 0o755); err != nil {
		return err
	}
	for _, d := range []string{n.runDir, n.path("logs"), n.path("pki")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	var env []string
	if l := n.cfg.LAN; l != nil {
		var rs []string
		for _, r := range l.hostRoutes(n) {
			rs = append(rs, strings.Join(r, " "))
		}
		env = append(env, "AMF_JANITOR_ROUTES="+strings.Join(rs, ";"))
	}
	if n.janitor, err = startJanitor(n.Cgroup, n.Index, []string{n.Dir, n.runDir}, n.lock, filepath.Join(lockDir, strconv.Itoa(n.Index)+".janitor.log"), env); err != nil {
		return err
	}
	if err := saveTunables(); err != nil {
		return fmt.Errorf("record the kernel tunables the kubelet sets: %w", err)
	}
	if err := n.makeCgroups(); err != nil {
		return err
	}
	if err := n.startHolder(ctx); err != nil {
		return err
	}
	if n.cfg.LAN != nil {
		if err := n.cfg.LAN.plug(n); err != nil {
			return err
		}
	} else {
		if err := n.network(); err != nil {
			return err
		}
		if err := n.startRelay(); err != nil {
			return err
		}
	}
	if err := n.writeConfigs(); err != nil {
		return err
	}
	if err := n.startContainerd(ctx); err != nil {
		return err
	}
	if err := n.importImages(ctx); err != nil {
		return err
	}
	if n.cfg.LAN == nil { // a LAN publishes its gateway instead
		if err := n.publishAPIEndpoint(ctx); err != nil {
			return err
		}
	}
	for _, name := range []string{"kubelet", "kube-proxy"} {
		if err := n.startDaemon(name, n.daemonArgs(name)...); err != nil {
			return err
		}
	}
	return n.waitReady(ctx)
}

// hierarchies lists the mounted cgroup hierarchies (v1 controllers, the named
// systemd one, and the hybrid cgroup2 mount) as folders under /sys/fs/cgroup.
func hierarchies() ([]string, error) {
	ents, err := os.ReadDir("/sys/fs/cgroup")
	if err != nil {
		return nil, err
	}
	var hs []string
	for _, e := range ents {
		p := filepath.Join("/sys/fs/cgroup", e.Name())
		if fi, err := os.Lstat(p); err != nil || !fi.IsDir() { // cpu,cpuacct links
			continue
		}
		if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err == nil {
			hs = append(hs, p)
		}
	}
	return hs, nil
}

// makeCgroups creates /<cgroup>/system in every hierarchy; the daemons join it.
func (n *Node) makeCgroups() error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		for _, d := range []string{filepath.Join(h, n.Cgroup), filepath.Join(h, n.Cgroup, "system")} {
			if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return fmt.Errorf("cgroup %s: %w", d, err)
			}
			if filepath.Base(h) == "cpuset" { // a new cpuset is empty: no CPU, no memory node
				for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
					b, err := os.ReadFile(filepath.Join(h, f))
					if err != nil {
						return err
					}
					if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
						return fmt.Errorf("cgroup %s: %w", filepath.Join(d, f), err)
					}
				}
			}
		}
	}
	return nil
}

// joinCgroups is a shell prologue that moves the shell into the node's system
// cgroup in every hierarchy before it execs the daemon, so the daemon and
// everything it starts (containerd's shims included) are the node's.
func (n *Node) joinCgroups() string {
	return fmt.Sprintf(`for h in /sys/fs/cgroup/*/; do [ -f "${h}%s/system/cgroup.procs" ] && echo $$ >"${h}%s/system/cgroup.procs"; done; `, n.Cgroup, n.Cgroup)
}

// startHolder starts the process that holds the node's network and mount
// namespaces: the other daemons enter its namespaces with nsenter.
func (n *Node) startHolder(ctx context.Context) error {
	// /var/lib/kubelet/device-plugins is the kubelet's whatever its
	// --root-dir (the device plugin API fixes the path): each kubelet
	// empties it at start and binds kubelet.sock there, so nodes started
	// side by side on one folder lost that race ("bind: address already
	// in use", the kubelet exits).
	mounts := []string{"/run/containerd", "/run/netns", "/run/amf", "/var/lib/cni", "/var/log/pods", "/var/log/containers", "/var/lib/kubelet/device-plugins"}
	script := "set -e; "
	for _, m := range mounts {
		script += fmt.Sprintf("mkdir -p %s && mount -t tmpfs -o mode=0755 tmpfs %s; ", m, m)
	}
	// As on a systemd host, where every mount is shared: a pod that mounts
	// the netns folder with HostToContainer (amf-connkill) sees the
	// namespaces made after it started, and containerd refuses the mount
	// of a private one.
	script += "mount --make-shared /run/netns; "
	script += "echo ready; exec sleep infinity"
	d, err := n.newDaemon("holder", "/bin/sh", "-c", n.joinCgroups()+
		"exec unshare --net --mount --propagation private /bin/sh -c '"+script+"'")
	if err != nil {
		return err
	}
	ready := make(chan struct{})
	d.onLine = func(l string) {
		if l == "ready" {
			close(ready)
		}
	}
	if err := d.start(); err != nil {
		return err
	}
	select {
	case <-ready:
	case <-d.done:
		return fmt.Errorf("the namespace holder exited: %v: %s", d.err, d.logTail(2<<10))
	case <-ctx.Done():
		return ctx.Err()
	}
	// The holder is sh → unshare → sh → sleep by exec: one PID throughout.
	n.holder = d
	n.NetNS = fmt.Sprintf("/proc/%d/ns/net", d.cmd.Process.Pid)
	return nil
}

// nsenter returns the command prefix that enters the node's namespaces.
func (n *Node) nsenter() []string {
	return []string{"nsenter", "--target", strconv.Itoa(n.holder.cmd.Process.Pid), "--net", "--mount", "--"}
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// network plugs the node into the host with a veth pair and closes every
// other way out: the node's default route is unreachable.
func (n *Node) network() error {
	veth := fmt.Sprintf("amfv%d", n.Index)
	_ = run("ip", "link", "del", veth) // a stale one from a dead node
	pid := strconv.Itoa(n.holder.cmd.Process.Pid)
	in := func(args ...string) error {
		return run("nsenter", append([]string{"--target", pid, "--net", "--"}, args...)...)
	}
	steps := []func() error{
		func() error {
			return run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", pid)
		},
		func() error { return run("ip", "addr", "add", n.hostIP+"/24", "dev", veth) },
		func() error { return run("ip", "link", "set", veth, "up") },
		func() error { return run("ip", "route", "add", n.PodCIDR, "via", n.IP, "dev", veth) },
		func() error { return in("ip", "link", "set", "lo", "up") },
		func() error { return in("ip", "addr", "add", n.IP+"/24", "dev", "eth0") },
		func() error { return in("ip", "link", "set", "eth0", "up") },
		func() error { return in("ip", "route", "add", "unreachable", "default") },
		func() error { return in("sysctl", "-q", "-w", "net.ipv4.ip_forward=1") },
		// Pods on one bridge reaching each other through a ClusterIP or a
		// hostPort: the bridge's frames must pass iptables.
		func() error { return in("sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1") },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return fmt.Errorf("node network: %w", err)
		}
	}
	return nil
}

// startRelay serves the API server inside the node's namespace.
func (n *Node) startRelay() error {
	l, err := ListenIn(n.NetNS, net.JoinHostPort(n.IP, strconv.Itoa(APIServerPort)))
	if err != nil {
		return fmt.Errorf("API server relay: %w", err)
	}
	n.relay = newRelay(l, "127.0.0.1:"+strconv.Itoa(n.cfg.ControlPlane.APIServerPort()))
	return nil
}

func (n *Node) writeConfigs() error {
	cp := n.cfg.ControlPlane
	server := "https://" + net.JoinHostPort(n.IP, strconv.Itoa(APIServerPort))
	if n.cfg.LAN != nil {
		server = "https://" + net.JoinHostPort(LANGateway, strconv.Itoa(APIServerPort))
	}
	for _, k := range []struct {
		file, cn string
		groups   []string
	}{
		{"kubelet.kubeconfig", "system:node:" + n.Name, []string{"system:nodes"}},
		{"kube-proxy.kubeconfig", "system:kube-proxy", nil},
	} {
		cert, key, err := cp.ClientCertificate(k.cn, k.groups...)
		if err != nil {
			return err
		}
		if err := cp.WriteCertKubeconfig(n.path(k.file), server, cert, key); err != nil {
			return err
		}
	}
	if err := writeAtomic(n.path("pki", "ca.crt"), cp.CAPEM(), 0o644); err != nil {
		return err
	}
	// Pods get no name server: nothing in the lab resolves names, and a pod
	// must not try the host's.
	if err := writeAtomic(n.path("resolv.conf"), []byte("nameserver 127.0.0.1\noptions ndots:1\n"), 0o644); err != nil {
		return err
	}
	kc, err := n.kubeletConfig()
	if err != nil {
		return err
	}
	pc, err := n.kubeProxyConfig()
	if err != nil {
		return err
	}
	cni, err := n.cniConfig()
	if err != nil {
		return err
	}
	for _, f := range []struct {
		path string
		data []byte
	}{
		{n.path("containerd.toml"), []byte(n.containerdConfig())},
		{n.path("kubelet.yaml"), kc},
		{n.path("kube-proxy.yaml"), pc},
		{n.path("cni", "net.d", "10-amf-lab.conflist"), cni},
	} {
		if err := writeAtomic(f.path, f.data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func (n *Node) daemonArgs(name string) []string {
	switch name {
	case "kubelet":
		return []string{
			"--config=" + n.path("kubelet.yaml"),
			"--kubeconfig=" + n.path("kubelet.kubeconfig"),
			"--root-dir=" + n.path("kubelet"),
			"--cert-dir=" + n.path("kubelet", "pki"),
			"--hostname-override=" + n.Name,
			"--node-ip=" + n.IP,
			"--v=1",
		}
	case "kube-proxy":
		return []string{"--config=" + n.path("kube-proxy.yaml"), "--v=1"}
	}
	return nil
}

func (n *Node) startContainerd(ctx context.Context) error {
	if err := n.startDaemon("containerd", "--config="+n.path("containerd.toml")); err != nil {
		return err
	}
	return poll(ctx, "containerd's socket", n.daemon("containerd"), func() error {
		c, err := net.DialTimeout("unix", n.Socket, time.Second)
		if err != nil {
			return err
		}
		c.Close()
		return nil
	})
}

// Ctr runs ctr against the node's containerd in the k8s.io namespace.
func (n *Node) Ctr(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "ctr", append([]string{"--address", n.Socket, "--namespace", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

func (n *Node) importImages(ctx context.Context) error {
	for _, img := range n.cfg.Images {
		// Unpacked for overlayfs at import, so a pod's first start does not wait for it.
		if _, err := n.Ctr(ctx, "images", "import", "--all-platforms", "--snapshotter", "overlayfs", img); err != nil {
			return fmt.Errorf("import image %s: %w", img, err)
		}
	}
	return nil
}

// publishAPIEndpoint points the "kubernetes" Service at this node's relay, so
// in-cluster clients reach the API server through kube-proxy (the API server
// runs with --endpoint-reconciler-type=none: its own address is loopback).
func (n *Node) publishAPIEndpoint(ctx context.Context) error {
	c := n.cfg.ControlPlane.Client()
	name := "kubernetes-" + n.Name
	es := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: metav1.NamespaceDefault,
			Labels: map[string]string{discoveryv1.LabelServiceName: "kubernetes", discoveryv1.LabelManagedBy: "amf-lab-kubenode"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{n.IP}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
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

// waitReady watches the Node until it is Ready and schedulable.
func (n *Node) waitReady(ctx context.Context) error {
	c := n.cfg.ControlPlane.Client()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	for _, name := range []string{"containerd", "kubelet", "kube-proxy"} {
		d := n.daemon(name)
		go func() {
			select {
			case <-d.done:
				cancel(fmt.Errorf("%s exited: %v; log ends with:\n%s", d.name, d.err, d.logTail(4<<10)))
			case <-ctx.Done():
			}
		}()
	}
	nd, err := controlplane.WaitNodeSchedulable(ctx, c, n.Name)
	if err != nil {
		return fmt.Errorf("waiting for Node %s to be Ready: %w", n.Name, err)
	}
	n.KubeletVersion, n.RuntimeVersion = nd.Status.NodeInfo.KubeletVersion, nd.Status.NodeInfo.ContainerRuntimeVersion
	if n.cfg.LAN == nil {
		return nil
	}
	// On a LAN, where nodes are lost, a node is up once its heartbeat is:
	// the kubelet's first try at its Lease comes before it has registered
	// the Node, and it tries again after a back-off of up to 7 s, so the Node
	// can be Ready for seconds without a Lease.
	for delay := 50 * time.Millisecond; ; delay = min(2*delay, 500*time.Millisecond) {
		_, err := c.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, n.Name, metav1.GetOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsNotFound(err) && ctx.Err() == nil {
			return fmt.Errorf("the Lease of Node %s: %w", n.Name, err)
		}
		select {
		case <-ctx.Done():
			if c := context.Cause(ctx); c != nil {
				return fmt.Errorf("waiting for the Lease of Node %s: %w", n.Name, c)
			}
			return fmt.Errorf("waiting for the Lease of Node %s: %w", n.Name, ctx.Err())
		case <-time.After(delay):
		}
	}
}

// Stop tears the node down completely (see the package doc) and waits.
func (n *Node) Stop() {
	n.stopOnce.Do(func() {
		n.mu.Lock()
		n.stopped = true
		n.mu.Unlock()
		if n.relay != nil {
			n.relay.Close()
		}
		if n.janitor != nil {
			n.janitor.run()
		}
		for _, d := range n.allDaemons() {
			<-d.done // killed by the janitor; reaped by their waiters
		}
		if n.lock != nil {
			n.lock.Close()
		}
	})
}

func (n *Node) allDaemons() []*daemon {
	n.mu.Lock()
	defer n.mu.Unlock()
	var ds []*daemon
	if n.holder != nil {
		ds = append(ds, n.holder)
	}
	for _, d := range n.daemons {
		ds = append(ds, d)
	}
	return ds
}

func (n *Node) daemon(name string) *daemon {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.daemons[name]
}

// DumpLogs logs the end of each daemon's log (for a failed test).
func (n *Node) dumpLogs() {
	for _, d := range n.allDaemons() {
		n.cfg.Log("---- %s (%s), last 8 KiB ----\n%s", d.name, d.logPath, d.logTail(8<<10))
	}
}

// DumpLogs logs the end of each daemon's log through Config.Log.
func (n *Node) DumpLogs() { n.dumpLogs() }

// poll calls f until it succeeds, d exits, or ctx ends.
func poll(ctx context.Context, what string, d *daemon, f func() error) error {
	var err error
	for delay := time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		if err = f(); err == nil {
			return nil
		}
		select {
		case <-d.done:
			return fmt.Errorf("%s exited before %s was up: %v; log ends with:\n%s", d.name, what, d.err, d.logTail(4<<10))
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %v)", what, ctx.Err(), err)
		case <-time.After(delay):
		}
	}
}

// daemon is one of the node's processes, its output in logs/<name>.log.
type daemon struct {
	name, logPath string
	args          []string // the daemon's own arguments (startDaemon's), for a restart
	cmd           *exec.Cmd
	onLine        func(string)
	done          chan struct{}
	err           error
}

func (n *Node) newDaemon(name, bin string, args ...string) (*daemon, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	// The janitor kills the node's processes by cgroup; the death signal is a
	// second line for the daemons themselves (the shims re-parent away from it).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return &daemon{name: name, logPath: n.path("logs", name+".log"), cmd: cmd, done: make(chan struct{})}, nil
}

// startDaemon starts a daemon of the node inside its namespaces and cgroups.
func (n *Node) startDaemon(name string, args ...string) error {
	bin := name
	if name == "kubelet" || name == "kube-proxy" {
		bin = filepath.Join(n.cfg.BinDir, name)
	}
	argv := append(n.nsenter(), append([]string{bin}, args...)...)
	quoted := make([]string, len(argv))
	for i, a := range argv {
		quoted[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	d, err := n.newDaemon(name, "/bin/sh", "-c", n.joinCgroups()+"exec "+strings.Join(quoted, " "))
	if err != nil {
		return err
	}
	d.args = args
	// Registered under the lock that Stop takes, so a daemon started while
	// the node stops is either in the list Stop waits for or not started.
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		return fmt.Errorf("%s not started: the node is stopping", name)
	}
	if err := d.start(); err != nil {
		return err
	}
	n.daemons[name] = d
	return nil
}

func (d *daemon) start() error {
	f, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "=== %s %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(d.cmd.Args, " "))
	d.cmd.Stdout, d.cmd.Stderr = f, f
	var pr *os.File
	if d.onLine != nil {
		var pw *os.File
		if pr, pw, err = os.Pipe(); err != nil {
			f.Close()
			return err
		}
		d.cmd.Stdout = pw
		defer pw.Close()
	}
	if err := d.cmd.Start(); err != nil {
		f.Close()
		if pr != nil {
			pr.Close()
		}
		return fmt.Errorf("start %s: %w", d.name, err)
	}
	if pr != nil {
		go func() {
			sc := bufio.NewScanner(pr)
			for sc.Scan() {
				fmt.Fprintln(f, sc.Text())
				d.onLine(sc.Text())
			}
			pr.Close()
		}()
	}
	go func() {
		d.err = d.cmd.Wait()
		f.Close()
		close(d.done)
	}()
	return nil
}

// logTail returns the end of the daemon's log, starting at a line.
func (d *daemon) logTail(max int64) string { return proc.LogTail(d.logPath, max) }
