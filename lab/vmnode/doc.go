// Package vmnode runs a real Kubernetes node as Kubernetes ships it now
// inside a qemu guest, joined to a lab control plane on the host: a cgroup
// v2-only kernel, systemd as PID 1, the kubelet at its defaults
// (failCgroupV1 left true, so it refuses a cgroup v1 host), containerd 2
// built from the Go module proxy (tools/containerd), Debian's runc and CNI
// plugins, and the systemd cgroup driver in both the kubelet and containerd
// — what kubeadm (since 1.22) and k3s (on a host whose init is systemd) set
// up on a systemd Debian host.
//
// The guest boots from two disks. The base image (Debian 12 built by
// mmdebstrap, with the systemd units of guest/) is built once per machine
// into ~/.cache/amf/vmnode and booted copy-on-write (qemu's snapshot=on), so
// a run changes nothing in it. The second disk, made for each run, holds
// what changes: the kubelet and containerd binaries, the node's client
// certificate, its configs and the lab's image archives (no registry is
// reachable).
//
// By default the guest reaches nothing but the API server: qemu's user
// network runs with restrict=on, and one guest address (10.0.2.100:6443) is
// forwarded, connection by connection, to the API server on the host's
// loopback. Guest ports the caller asks for are forwarded from 127.0.0.1 on
// the host. The API server cannot reach the kubelet (no logs or exec
// through it).
//
// With Config.LAN the guest is one more node of a lab/kubenode cluster's
// LAN instead: a kubenode.Tap on the LAN's bridge (a node slot's addresses,
// routed from the LAN and the host as a node's are), its static address
// from the run's disk, the API server through the LAN's relay. Pods on the
// guest and on the lab's nodes reach each other, the host reaches the
// guest's pods at their addresses, and the API server its kubelet. The
// guest's probe answers the host's uplinks alone.
//
// Test infrastructure: product code never imports it.
package vmnode
