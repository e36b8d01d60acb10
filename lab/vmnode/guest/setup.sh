# This run's setup, before containerd: written by lab/vmnode on the /amf disk.
set -eu
. /amf/env
hostname "$NODE_NAME"
# In-cluster clients dial the kubernetes Service (its ClusterIP, port 443).
# kube-proxy would send them to the API server's endpoints, the other lab
# nodes' addresses that this guest cannot reach; qemu forwards one guest
# address to the API server on the host's loopback, so that address it is.
for chain in OUTPUT PREROUTING; do
	iptables -t nat -A "$chain" -d "$API_CLUSTER_IP" -p tcp --dport 443 -j DNAT --to-destination "$API_GUEST_ADDR"
done
echo "amf-vmnode: guest cgroup=$(stat -fc %T /sys/fs/cgroup) kernel=$(uname -r) systemd=$(systemctl --version | sed -n '1s/^systemd \([0-9]*\).*/\1/p') runc=$(runc --version | sed -n '1s/^runc version //p') ip=$NODE_IP"
