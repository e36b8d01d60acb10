package kubenode

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"
)

// PauseImage is the sandbox image containerd runs as each pod's pause
// container; lab/images builds it (no registry is reachable).
const defaultPauseImage = "amf.lab/pause:v1"

// containerdConfig is containerd 1.6's config (version 2) for a node.
func (n *Node) containerdConfig() string {
	return fmt.Sprintf(`version = 2
root = %q
state = %q
# This VM refuses negative oom_score_adj (no CAP_SYS_RESOURCE): without these
# every sandbox fails in runc ("can't get final child's PID from pipe: EOF").
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %q

[ttrpc]
  address = %q

[debug]
  level = "info"

[metrics]
  address = ""

# Not /opt/containerd on the host.
[plugins."io.containerd.internal.v1.opt"]
  path = %q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true
  max_container_log_line_size = 16384
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    # Imported images are never pulled (IfNotPresent) and never collected.
    discard_unpacked_layers = false
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
    max_conf_num = 1
`, n.path("containerd", "root"), n.runPath("containerd-state"), n.Socket, n.runPath("containerd.sock.ttrpc"),
		n.path("containerd", "opt"), n.cfg.PauseImage, n.cfg.CNIBinDir, n.path("cni", "net.d"))
}

// cniConfig is the pod network: a bridge with the node as gateway, host-local
// addresses in the node's pod range, and hostPort mappings (portmap, with SNAT
// so a pod reaching another pod's hostPort on the node's IP gets the replies).
func (n *Node) cniConfig() ([]byte, error) {
	conf := map[string]any{
		"cniVersion": "0.4.0",
		"name":       "amf-lab",
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"ranges":  [][]map[string]string{{{"subnet": n.PodCIDR, "gateway": n.podGateway}}},
					"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
					"dataDir": "/var/lib/cni/networks",
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}, "snat": true},
		},
	}
	return json.MarshalIndent(conf, "", "  ")
}

// kubeletConfig is the KubeletConfiguration of the node.
func (n *Node) kubeletConfig() ([]byte, error) {
	c := map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"kind":       "KubeletConfiguration",
		// Kubernetes 1.35+ refuses cgroup v1 unless told; this host is v1.
		"failCgroupV1":             false,
		"cgroupDriver":             "cgroupfs",
		"cgroupRoot":               "/" + n.Cgroup,
		"cgroupsPerQOS":            true,
		"enforceNodeAllocatable":   []string{"pods"},
		"failSwapOn":               false,
		"containerRuntimeEndpoint": "unix://" + n.Socket,
		"address":                  n.IP,
		"port":                     10250,
		"readOnlyPort":             0,
		"healthzBindAddress":       "127.0.0.1",
		"healthzPort":              10248,
		"authentication": map[string]any{
			"anonymous": map[string]bool{"enabled": false},
			"webhook":   map[string]bool{"enabled": true},
			"x509":      map[string]string{"clientCAFile": n.path("pki", "ca.crt")},
		},
		"authorization":       map[string]string{"mode": "Webhook"},
		"resolvConf":          n.path("resolv.conf"),
		"clusterDomain":       "cluster.local",
		"podLogsDir":          "/var/log/pods",
		"registerNode":        true,
		"maxPods":             110,
		"serializeImagePulls": false,
		// A lab node on a shared disk: never evict for disk, never collect an
		// imported image (it cannot be pulled again).
		"evictionHard": map[string]string{
			"memory.available": "100Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%", "imagefs.available": "1%",
		},
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"containerLogMaxSize":         "10Mi",
		"shutdownGracePeriod":         "0s",
		"rotateCertificates":          false,
		"serverTLSBootstrap":          false,
	}
	if n.cfg.MaxRestartBackoff > 0 {
		c["crashLoopBackOff"] = map[string]string{"maxContainerRestartPeriod": n.cfg.MaxRestartBackoff.String()}
		c["featureGates"] = map[string]bool{"KubeletCrashLoopBackOffMax": true}
	}
	return yaml.Marshal(c)
}

// kubeProxyConfig is kube-proxy's configuration (iptables mode).
func (n *Node) kubeProxyConfig() ([]byte, error) {
	cluster := n.PodCIDR
	if n.cfg.LAN != nil {
		cluster = AllPods // every node's pods are the cluster's
	}
	return yaml.Marshal(map[string]any{
		"apiVersion":       "kubeproxy.config.k8s.io/v1alpha1",
		"kind":             "KubeProxyConfiguration",
		"clientConnection": map[string]string{"kubeconfig": n.path("kube-proxy.kubeconfig")},
		"hostnameOverride": n.Name,
		"mode":             "iptables",
		"clusterCIDR":      cluster,
		// Inside a network namespace the global conntrack table size is read-only.
		"conntrack":          map[string]any{"maxPerCore": 0, "min": 0},
		"metricsBindAddress": "127.0.0.1:10249",
		"healthzBindAddress": "127.0.0.1:10256",
		"iptables":           map[string]any{"syncPeriod": "30s", "minSyncPeriod": "0s"},
	})
}

// writeAtomic writes a file through a temporary one and a rename: containerd
// reads CNI configs as they appear and once read a half-written one.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
