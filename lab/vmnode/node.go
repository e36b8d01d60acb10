package vmnode

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/amf-edge/amf/lab/cgroup2vm"
	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/images"
	"github.com/amf-edge/amf/lab/kubenode"
	"github.com/amf-edge/amf/ociimage"
)

// Config configures Launch.
type Config struct {
	// ControlPlane is the cluster to join (lab/controlplane, on this host).
	ControlPlane *controlplane.ControlPlane
	// Repo is the repository root (for tools/containerd's pinned version).
	Repo string
	// Name is the Node's name (default amf-vmnode).
	Name string
	// Images are image archives (lab/images) imported before the kubelet
	// starts; PauseImage (default images.PauseRef) must be among them.
	Images     []string
	PauseImage string
	// Files are more files for the run's disk: the path under /amf in the
	// guest (bin/amf-lab, say) → the host's file. Programs under /amf are
	// what Node.Run may run.
	Files map[string]string
	// CPUs and MemoryMiB size the guest (default 2 and 2048).
	CPUs, MemoryMiB int
	// Forward lists guest TCP ports reachable from the host: Node.Forwarded
	// gives the address of each (on 127.0.0.1; on a LAN, the guest's own).
	Forward []int
	// LAN, if set, puts the guest on a lab LAN beside lab/kubenode's nodes
	// (a kubenode.Tap on its bridge) instead of qemu's user network: it
	// holds a node slot's addresses, reaches the API server through the
	// LAN's relay, and its pods and the other nodes' reach one another, as
	// on a cluster of real nodes.
	LAN *kubenode.LAN
	// Console receives the guest's console, line by line (it is kept in the
	// node's folder too).
	Console io.Writer
	// Log reports progress (default: nothing).
	Log func(format string, args ...any)
}

// Node is a running guest node.
type Node struct {
	Name string
	// Dir holds the run's disk and the guest's console log.
	Dir string
	// KubeletVersion and RuntimeVersion are what the Node reports.
	KubeletVersion, RuntimeVersion string
	// Guest is what the guest said of itself before containerd started:
	// cgroup (the file system at /sys/fs/cgroup: cgroup2fs), kernel, systemd,
	// runc, ip.
	Guest map[string]string
	// Forwarded maps each of Config.Forward to its host address.
	Forwarded map[int]string
	// IP is the guest's address (the Node's InternalIP) and PodCIDR its
	// pods' range.
	IP, PodCIDR string

	cfg     Config
	apiAddr string        // where the guest reaches the API server
	tap     *kubenode.Tap // its LAN port, on a LAN
	cmd     *exec.Cmd
	done    chan struct{} // closed when qemu has exited
	err     error         // qemu's exit, once done

	mu      sync.Mutex
	failed  []string // the guest's reports of failed units
	console *os.File
}

// Launch builds what is missing (the base image, once per machine), boots
// the guest and returns once its Node is Ready. Stop ends it.
func Launch(ctx context.Context, cfg Config) (_ *Node, err error) {
	if cfg.ControlPlane == nil || cfg.Repo == "" {
		return nil, errors.New("vmnode: Config needs the ControlPlane to join and the Repo (the repository root: tools/containerd's pin, the guest's probe)")
	}
	if cfg.Name == "" {
		cfg.Name = "amf-vmnode"
	}
	if cfg.PauseImage == "" {
		cfg.PauseImage = images.PauseRef
	}
	if cfg.CPUs == 0 {
		cfg.CPUs = 2
	}
	if cfg.MemoryMiB == 0 {
		cfg.MemoryMiB = 2048
	}
	if cfg.Log == nil {
		cfg.Log = func(string, ...any) {}
	}
	if err := Check(); err != nil {
		return nil, err
	}
	base, err := buildBase(ctx, cfg.Log)
	if err != nil {
		return nil, fmt.Errorf("vmnode: %w", err)
	}
	sweepStale()
	dir, err := os.MkdirTemp("", fmt.Sprintf("amf-vmnode-%d-", os.Getpid()))
	if err != nil {
		return nil, err
	}
	n := &Node{Name: cfg.Name, Dir: dir, cfg: cfg, Guest: map[string]string{}, Forwarded: map[int]string{}, done: make(chan struct{}),
		IP: guestIP, PodCIDR: PodCIDR, apiAddr: apiGuestAddr}
	defer func() {
		if err != nil {
			n.Stop()
		}
	}()
	if cfg.LAN != nil {
		if n.tap, err = cfg.LAN.AddTap(); err != nil {
			return nil, fmt.Errorf("vmnode: %w", err)
		}
		n.IP, n.PodCIDR = n.tap.IP, n.tap.PodCIDR
		n.apiAddr = net.JoinHostPort(n.tap.Gateway, strconv.Itoa(kubenode.APIServerPort))
	}
	disk, err := n.writeRunDisk()
	if err != nil {
		return nil, fmt.Errorf("vmnode: the run's disk: %w", err)
	}
	if err := n.boot(base, disk); err != nil {
		return nil, fmt.Errorf("vmnode: %w", err)
	}
	if err := n.waitReady(ctx); err != nil {
		return nil, fmt.Errorf("vmnode: %w", err)
	}
	return n, nil
}

// Check reports what this host lacks to run a guest node.
func Check() error {
	for _, c := range []string{"qemu-system-x86_64", "mmdebstrap", "mkfs.ext4", "socat"} {
		if _, err := exec.LookPath(c); err != nil {
			return fmt.Errorf("vmnode: no %s on this host (make deps installs it)", c)
		}
	}
	if os.Geteuid() != 0 {
		return errors.New("vmnode: building the node's root filesystem needs root")
	}
	return nil
}

// writeRunDisk writes the run's files (binaries, certificate, configs,
// images, the guest's scripts) and makes them an ext4 disk labelled
// amf-node, which the guest mounts read-only at /amf.
func (n *Node) writeRunDisk() (string, error) {
	root := filepath.Join(n.Dir, "amf")
	k8sBin, err := controlplane.BinDir()
	if err != nil {
		return "", err
	}
	ctrBin, err := ContainerdBinDir(n.cfg.Repo, "amd64")
	if err != nil {
		return "", err
	}
	files := map[string]string{ // destination under /amf → source
		"bin/kubelet": filepath.Join(k8sBin, "kubelet"),
	}
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "ctr"} {
		files["bin/"+b] = filepath.Join(ctrBin, b)
	}
	for dst, src := range n.cfg.Files {
		files[dst] = src
	}
	for i, img := range n.cfg.Images {
		files[fmt.Sprintf("images/%02d.tar", i)] = img
	}
	if err := ociimage.GoBuild(context.Background(), os.Getenv("GO"), n.cfg.Repo, "amd64", filepath.Join(root, "bin"), "./lab/vmnode/guestprobe"); err != nil {
		return "", err
	}
	for dst, src := range files {
		if err := place(src, filepath.Join(root, dst)); err != nil {
			if strings.HasPrefix(dst, "bin/") {
				return "", fmt.Errorf("%w (run make k8s and make containerd)", err)
			}
			return "", err
		}
	}
	cp := n.cfg.ControlPlane
	cert, key, err := cp.ClientCertificate("system:node:"+n.Name, "system:nodes")
	if err != nil {
		return "", err
	}
	kc := clientcmdapi.NewConfig()
	// The API server's certificate names 127.0.0.1, where the guest's
	// forwarded or relayed address ends.
	kc.Clusters["lab"] = &clientcmdapi.Cluster{Server: "https://" + n.apiAddr, CertificateAuthorityData: cp.CAPEM(), TLSServerName: "127.0.0.1"}
	kc.AuthInfos["node"] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	kc.Contexts["lab"] = &clientcmdapi.Context{Cluster: "lab", AuthInfo: "node"}
	kc.CurrentContext = "lab"
	if err := clientcmd.WriteToFile(*kc, filepath.Join(root, "kubelet.kubeconfig")); err != nil {
		return "", err
	}
	kubelet, err := kubeletConfig()
	if err != nil {
		return "", err
	}
	cni, err := cniConfig(n.PodCIDR, n.tap == nil)
	if err != nil {
		return "", err
	}
	written := map[string][]byte{
		"ca.crt":                     cp.CAPEM(),
		"kubelet.yaml":               kubelet,
		"containerd.toml":            []byte(containerdConfig(n.cfg.PauseImage)),
		"cni/10-amf-vmnode.conflist": cni,
		"env":                        []byte(envFile(n.Name, n.IP, n.apiAddr, n.probeFrom())),
		// Pods get no name server: nothing in the lab resolves names.
		"resolv.conf": []byte("nameserver 127.0.0.1\noptions ndots:1\n"),
	}
	if n.tap != nil {
		// amf-node-net.service puts it beside the base's DHCP one
		// (10-amf.network), which it sorts before.
		written["net/05-amf-lan.network"] = []byte(lanNetwork(n.tap))
	}
	for _, s := range []string{"setup.sh", "images.sh", "failed.sh"} {
		if written[s], err = guestFiles.ReadFile("guest/" + s); err != nil {
			return "", err
		}
	}
	for dst, data := range written {
		p := filepath.Join(root, dst)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return "", err
		}
	}
	var size int64
	_ = filepath.Walk(root, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			size += fi.Size()
		}
		return nil
	})
	disk := filepath.Join(n.Dir, "amf.img")
	mib := size*5/4>>20 + 64
	if err := runLogged(context.Background(), "mkfs.ext4", "-q", "-F", "-L", "amf-node", "-d", root, disk, strconv.FormatInt(mib, 10)+"M"); err != nil {
		return "", err
	}
	return disk, os.RemoveAll(root)
}

// place puts src at dst: a hard link where it can, else a copy.
func place(src, dst string) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// kernelArgs boot the base without an initramfs (NVMe and ext4 are built
// into Debian's cloud kernel) on the cgroup v2 hierarchy only.
const kernelArgs = "root=/dev/nvme0n1 rw console=ttyS0 panic=-1 quiet cgroup_no_v1=all systemd.unified_cgroup_hierarchy=1 systemd.show_status=false"

// boot starts qemu: TCG (KVM does not boot a guest in every VM), the base
// booted copy-on-write, the run's disk read-only, and the user network
// restricted to the forwards, or the LAN's tap.
func (n *Node) boot(base baseImage, disk string) error {
	netdev, err := n.netdev()
	if err != nil {
		return err
	}
	args := []string{
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-monitor", "none", "-serial", "stdio",
		"-machine", "q35", "-accel", "tcg,thread=multi", "-cpu", "max",
		"-smp", strconv.Itoa(n.cfg.CPUs), "-m", strconv.Itoa(n.cfg.MemoryMiB),
		"-kernel", base.Kernel, "-append", kernelArgs,
		"-drive", "file=" + base.Root + ",if=none,id=root,format=raw,snapshot=on,cache=unsafe",
		"-device", "nvme,drive=root,serial=amf-root",
		"-drive", "file=" + disk + ",if=none,id=run,format=raw,readonly=on",
		"-device", "nvme,drive=run,serial=amf-run",
		"-netdev", netdev, "-device", "virtio-net-pci,netdev=net0" + n.mac(),
	}
	if n.console, err = os.Create(filepath.Join(n.Dir, "console.log")); err != nil {
		return err
	}
	n.cmd = exec.Command("qemu-system-x86_64", args...)
	if n.tap != nil {
		// The tap is in the LAN's namespace: qemu opens it there (nsenter
		// execs qemu in its own process, so the death signal holds).
		n.cmd = exec.Command("nsenter", append([]string{"--net=" + n.tap.NetNS, "--", "qemu-system-x86_64"}, args...)...)
	}
	// Its own process group, killed with this process if this process dies.
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var stderr strings.Builder
	n.cmd.Stderr = &stderr
	out, err := n.cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := n.cmd.Start(); err != nil {
		return fmt.Errorf("start qemu: %w", err)
	}
	n.cfg.Log("vmnode: booting %s (base %s, TCG, %d CPUs, %d MiB)", n.Name, base.Key, n.cfg.CPUs, n.cfg.MemoryMiB)
	go func() {
		n.readConsole(out)
		err := n.cmd.Wait()
		if s := strings.TrimSpace(stderr.String()); s != "" {
			err = fmt.Errorf("%v: %s", err, s)
		}
		n.err = err
		close(n.done)
	}()
	return nil
}

// probeFrom is where the host's connections to the guest come from: qemu's
// gateway on the user network, the LAN's uplinks on a LAN (never its pods
// or other nodes).
func (n *Node) probeFrom() string {
	if n.tap != nil {
		return kubenode.Uplinks
	}
	return hostOnUserNet
}

// mac is the NIC's MAC address option on a LAN, one per node slot, so
// that guests on one LAN never share qemu's default; "" on the user
// network, which is the guest's alone.
func (n *Node) mac() string {
	if n.tap == nil {
		return ""
	}
	return fmt.Sprintf(",mac=52:54:00:a3:f0:%02x", n.tap.Index)
}

// netdev is qemu's -netdev: the LAN's tap (every port the guest serves is
// reached at its own address), or the user network, restricted, with one
// guest address relayed to the API server and the ports to forward.
func (n *Node) netdev() (string, error) {
	ports := append([]int{probePort}, n.cfg.Forward...)
	if n.tap != nil {
		for _, p := range ports {
			n.Forwarded[p] = net.JoinHostPort(n.IP, strconv.Itoa(p))
		}
		return "tap,id=net0,ifname=" + n.tap.Name + ",script=no,downscript=no", nil
	}
	netdev := "user,id=net0,restrict=on,net=10.0.2.0/24,dhcpstart=" + guestIP
	// One socat per guest connection, ended when qemu closes its end.
	netdev += fmt.Sprintf(",guestfwd=tcp:%s-cmd:socat STDIO TCP:127.0.0.1:%d", apiGuestAddr, n.cfg.ControlPlane.APIServerPort())
	for _, p := range ports {
		hp, err := freePort()
		if err != nil {
			return "", err
		}
		n.Forwarded[p] = net.JoinHostPort("127.0.0.1", strconv.Itoa(hp))
		netdev += fmt.Sprintf(",hostfwd=tcp:127.0.0.1:%d-:%d", hp, p)
	}
	return netdev, nil
}

// readConsole copies the console to the log and Config.Console and reads
// the guest's own lines ("amf-vmnode: ...").
func (n *Node) readConsole(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := cgroup2vm.ConsoleLine(sc.Text())
		fmt.Fprintln(n.console, l)
		if n.cfg.Console != nil {
			fmt.Fprintln(n.cfg.Console, l)
		}
		// Lines of the guest's units come as "[ uptime] unit[pid]: text".
		i := strings.Index(l, "amf-vmnode: ")
		if i < 0 {
			continue
		}
		rest := l[i+len("amf-vmnode: "):]
		kind, fields, _ := strings.Cut(rest, " ")
		n.mu.Lock()
		switch kind {
		case "guest":
			for _, f := range strings.Fields(fields) {
				if k, v, ok := strings.Cut(f, "="); ok {
					n.Guest[k] = v
				}
			}
		case "failed":
			n.failed = append(n.failed, fields)
		}
		n.mu.Unlock()
	}
}

// waitReady watches the Node until it is Ready, or the guest ends.
func (n *Node) waitReady(ctx context.Context) error {
	c := n.cfg.ControlPlane.Client()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-n.done:
			cancel(fmt.Errorf("qemu exited: %v; the console ends with:\n%s", n.err, n.ConsoleTail(4<<10)))
		case <-ctx.Done():
		}
	}()
	nd, err := controlplane.WaitNodeSchedulable(ctx, c, n.Name)
	if err != nil {
		return fmt.Errorf("waiting for Node %s to be Ready: %w; the guest says:\n%s", n.Name, err, n.whyNotReady())
	}
	n.KubeletVersion, n.RuntimeVersion = nd.Status.NodeInfo.KubeletVersion, nd.Status.NodeInfo.ContainerRuntimeVersion
	return nil
}

// whyNotReady asks the guest (if its probe still answers) what a Node that
// never turned Ready is read by: its network, its failed units and the
// kubelet's last lines; and the console's end.
func (n *Node) whyNotReady() string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b strings.Builder
	for _, c := range [][]string{
		{"/usr/sbin/ip", "addr"}, {"/usr/sbin/ip", "route"},
		{"/usr/bin/systemctl", "--failed", "--no-pager"},
		{"/usr/bin/journalctl", "-u", "systemd-networkd", "-u", "kubelet", "-n", "40", "--no-pager", "-o", "cat"},
	} {
		out, err := n.Run(ctx, c[0], c[1:]...)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", strings.Join(c, " "), err)
			continue
		}
		fmt.Fprintf(&b, "%s:\n%s\n", strings.Join(c, " "), out)
	}
	fmt.Fprintf(&b, "the console ends with:\n%s", n.ConsoleTail(4<<10))
	return b.String()
}

// CgroupMode names the guest's cgroup hierarchy, as the guest reported it (v2:
// cgroup2fs at /sys/fs/cgroup), and the driver its kubelet and containerd
// use (CgroupDriver).
func (n *Node) CgroupMode() (version, driver string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch n.Guest["cgroup"] {
	case "cgroup2fs":
		version = "v2"
	case "tmpfs":
		version = "v1"
	default:
		version = "unknown (" + n.Guest["cgroup"] + ")"
	}
	return version, CgroupDriver
}

// Failed returns the guest's reports of units that ended other than by a
// clean stop (containerd, the kubelet).
func (n *Node) Failed() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.failed...)
}

// ConsoleTail returns the end of the guest's console.
func (n *Node) ConsoleTail(max int64) string {
	b, _ := os.ReadFile(filepath.Join(n.Dir, "console.log"))
	return tail(b, int(max))
}

// Stop powers the guest off (kills qemu: its disk changes live only in
// qemu's snapshot), deletes the Node and removes the run's folder.
func (n *Node) Stop() {
	if n.cmd != nil && n.cmd.Process != nil {
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
		<-n.done
	}
	if n.console != nil {
		n.console.Close()
	}
	if n.tap != nil {
		n.tap.Remove()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = n.cfg.ControlPlane.Client().CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{})
	_ = os.RemoveAll(n.Dir)
}

// sweepStale removes the folders of runs whose process is gone (killed
// before its Stop).
func sweepStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "amf-vmnode-*-*"))
	for _, d := range dirs {
		f := strings.SplitN(filepath.Base(d), "-", 4)
		if len(f) < 4 {
			continue
		}
		pid, err := strconv.Atoi(f[2])
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(d)
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
