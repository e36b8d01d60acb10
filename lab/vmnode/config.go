package vmnode

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/amf-edge/amf/lab/controlplane"
	"github.com/amf-edge/amf/lab/kubenode"
)

// The guest's side of qemu's user network: its own address (the first that
// qemu's DHCP gives) and the address forwarded to the API server. On a lab
// LAN (Config.LAN) its addresses are its kubenode.Tap's instead.
const (
	guestIP      = "10.0.2.15"
	apiGuestAddr = "10.0.2.100:6443"
	// apiClusterIP is the kubernetes Service's ClusterIP (the first of the
	// lab control plane's service range, 10.96.0.0/16).
	apiClusterIP = "10.96.0.1"
	// PodCIDR is the guest's pod range on qemu's user network: apart from
	// the lab's host nodes' (10.214.<slot>.0/24), as pods of this node are
	// reached through it only.
	PodCIDR = "10.219.0.0/24"
)

// CgroupDriver is the driver both the kubelet and containerd use in the
// guest: systemd, the default of kubeadm (since 1.22) and of k3s on a host
// whose init is systemd — on such a host systemd owns the cgroup tree, and a
// second writer (cgroupfs) is what systemd's delegation rules forbid.
const CgroupDriver = "systemd"

// containerdConfig is containerd 2's config (version 3): the systemd cgroup
// driver, Debian's runc and CNI plugins, the lab's pause image (no registry
// is reachable). Everything else stays at containerd's defaults.
func containerdConfig(pause string) string {
	return fmt.Sprintf(`version = 3

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  # Imported images are never pulled again (IfNotPresent) and never collected.
  discard_unpacked_layers = false
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %q

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = 'io.containerd.runc.v2'
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
    BinaryName = '/usr/bin/runc'
    SystemdCgroup = true

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ['/usr/lib/cni']
  conf_dir = '/amf/cni'
`, pause)
}

// kubeletConfig is the guest kubelet's configuration: its defaults, but for
// the systemd driver, how it reaches containerd and the API server's CA, and
// the lab's small disk (no eviction for disk, no image collection: an
// imported image cannot be pulled again). failCgroupV1 is not set: at its
// default (true since 1.35) the kubelet refuses a cgroup v1 host.
func kubeletConfig() ([]byte, error) {
	return yaml.Marshal(map[string]any{
		"apiVersion":               "kubelet.config.k8s.io/v1beta1",
		"kind":                     "KubeletConfiguration",
		"cgroupDriver":             CgroupDriver,
		"containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
		"readOnlyPort":             0,
		"authentication": map[string]any{
			"anonymous": map[string]bool{"enabled": false},
			"webhook":   map[string]bool{"enabled": true},
			"x509":      map[string]string{"clientCAFile": "/amf/ca.crt"},
		},
		"authorization": map[string]string{"mode": "Webhook"},
		"clusterDomain": "cluster.local",
		"resolvConf":    "/amf/resolv.conf",
		"evictionHard": map[string]string{
			"memory.available": "100Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%", "imagefs.available": "1%",
		},
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"rotateCertificates":          false,
	})
}

// cniConfig is the pod network: a bridge with the guest as gateway,
// host-local addresses in podCIDR. On qemu's user network the pods are
// masqueraded (the guest's own address is the only one qemu routes); on a
// lab LAN they keep their addresses, which the LAN routes to the guest.
func cniConfig(podCIDR string, masquerade bool) ([]byte, error) {
	return json.MarshalIndent(map[string]any{
		"cniVersion": "0.4.0",
		"name":       "amf-vmnode",
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": masquerade, "hairpinMode": true,
				"ipam": map[string]any{
					"type":   "host-local",
					"ranges": [][]map[string]string{{{"subnet": podCIDR}}},
					"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}, "", "  ")
}

// envFile is /amf/env, read by the guest's units and scripts: apiAddr is
// where the guest reaches the API server, probeFrom the only source the
// guest's probe (which runs what it is asked, as root) answers: the host.
func envFile(name, ip, apiAddr, probeFrom string) string {
	return fmt.Sprintf("NODE_NAME=%s\nNODE_IP=%s\nAPI_CLUSTER_IP=%s\nAPI_GUEST_ADDR=%s\nPROBE_PORT=%d\nPROBE_FROM=%s\n",
		name, ip, apiClusterIP, apiAddr, probePort, probeFrom)
}

// hostOnUserNet is the host's address as the guest sees it on qemu's user
// network (its gateway): where forwarded connections come from.
const hostOnUserNet = "10.0.2.2/32"

// lanNetwork is the guest's NIC on a lab LAN (kubenode.Tap), for
// systemd-networkd: its address, the other nodes' pods, the host's uplinks
// and the Service range (ClusterIPs the guest's own clients dial are routed
// first, then rewritten by its DNAT of the API server's) through the LAN's
// router, and a dead-end default route, as every lab node has.
func lanNetwork(t *kubenode.Tap) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[Match]\nName=en*\n\n[Network]\nAddress=%s/16\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n", t.IP)
	for _, dst := range []string{kubenode.AllPods, kubenode.Uplinks, kubenode.ServiceIPs} {
		fmt.Fprintf(&b, "\n[Route]\nDestination=%s\nGateway=%s\n", dst, t.Gateway)
	}
	b.WriteString("\n[Route]\nDestination=0.0.0.0/0\nType=unreachable\n")
	return b.String()
}

// containerdVersion reads the containerd version tools/containerd/go.mod pins.
func containerdVersion(repo string) (string, error) {
	return controlplane.RequiredVersion(filepath.Join(repo, "tools", "containerd", "go.mod"), "github.com/containerd/containerd/v2")
}

// ContainerdBinDir is where tools/containerd/build.sh puts containerd for
// arch: $AMF_CONTAINERD_CACHE or ~/.cache/amf/containerd, then
// <version>/<arch>/bin.
func ContainerdBinDir(repo, arch string) (string, error) {
	v, err := containerdVersion(repo)
	if err != nil {
		return "", err
	}
	cache := os.Getenv("AMF_CONTAINERD_CACHE")
	if cache == "" {
		c, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("no cache folder for containerd: %w (set AMF_CONTAINERD_CACHE)", err)
		}
		cache = filepath.Join(c, "amf", "containerd")
	}
	return filepath.Join(cache, v, arch, "bin"), nil
}
