// Package kubenode runs a real Kubernetes node for the lab's tests and
// experiments: containerd, kubelet and kube-proxy built from the Kubernetes
// module (make k8s) and Debian's containerd, runc and CNI plugins, joined to a
// lab/controlplane API server. Test infrastructure: product code never imports it.
//
// A node lives in namespaces and cgroups of its own, so that it can run beside
// the host and other nodes and leave nothing behind:
//
//   - network: a namespace created for it, with one veth to the host
//     (10.213.<i>.2, the host end 10.213.<i>.1), pods on a CNI bridge in
//     10.214.<i>.0/24, and an unreachable default route, so nothing can leave.
//     The host routes the pod range to the node, which is how the API server
//     reaches the kubelet and tests reach pods.
//   - mounts: a private mount namespace with tmpfs over the paths containerd,
//     the CNI plugins and the kubelet hard-code (/run/containerd, /run/netns,
//     /var/lib/cni, /var/log/pods, /var/log/containers); everything mounted in
//     it goes when its last process does.
//   - cgroups: the kubelet's cgroupRoot is /amf-node<i> (as kind uses
//     /kubelet): a real kubelet removes pod cgroups under its root that it does
//     not know, so it must not share one. The node's daemons run in
//     /amf-node<i>/system, the pods in /amf-node<i>/kubepods.
//
// The node reaches the API server through a relay that the lab process serves
// inside the node's namespace (<node IP>:6443 → 127.0.0.1:<port>), so no
// traffic goes to an address of the host's own network; the "kubernetes"
// Service's EndpointSlice points there, so pods reach the API through
// kube-proxy's ClusterIP rules as on any cluster.
//
// Several nodes run as a cluster on one LAN (LaunchCluster, or NewLAN and
// Config.LAN): a network namespace the lab creates holds a bridge, each
// node's only link is a veth into it (node i at 10.215.<i>.2), and the LAN's
// gateway (LANGateway) relays to the API server, so a node reaches the API
// server, the other nodes and the host only across its LAN port. The host
// reaches the nodes and pods through one uplink veth into the LAN (amfl<j>,
// routed only to this LAN's node and pod addresses). The LAN has a dead-end
// default route, as every node has.
//
// Faults of a whole node (faults.go) act on what a real failure touches: the
// node's freezer cgroup, which its daemons join and so every shim and pod
// inherits (PowerCut: all frozen at once, and the LAN port down, so no FIN or
// RST is ever sent), its LAN port (Partition), its cgroup root's CPU quota
// (Starve), one daemon (StopDaemon); Restore undoes them.
//
// Teardown is one script, run by a janitor process that the node starts first
// and that waits on a pipe from the lab process: Stop closes the pipe, and so
// does the kernel when the lab process dies in any way (a test binary killed
// outright included). The janitor freezes the node's cgroups, kills every
// process in them, removes the cgroups and the node's files. A LAN has a
// janitor of its own (its namespace's holder runs in freezer:/amf-lan<j>),
// and a LAN node's janitor also removes the node's host routes.
package kubenode
