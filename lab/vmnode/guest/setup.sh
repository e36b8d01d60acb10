# This run's setup, before containerd: written by lab/vmnode on the /amf disk.
set -eu
. /amf/env
hostname "$NODE_NAME"
# In-cluster clients dial the kubernetes Service (its ClusterIP, port 443).
# The guest runs no kube-proxy: on qemu's user network the API server's
# endpoints are addresses it cannot reach, and qemu forwards one guest
# address to the API server on the host's loopback; on a lab LAN the LAN's
# router relays its own. That address it is.
for chain in OUTPUT PREROUTING; do
	iptables -t nat -A "$chain" -d "$API_CLUSTER_IP" -p tcp --dport 443 -j DNAT --to-destination "$API_GUEST_ADDR"
done
# The probe runs what it is asked, as root: the host alone may ask.
iptables -A INPUT -p tcp --dport "$PROBE_PORT" ! -s "$PROBE_FROM" -j DROP
echo "amf-vmnode: guest cgroup=$(stat -fc %T /sys/fs/cgroup) kernel=$(uname -r) systemd=$(systemctl --version | sed -n '1s/^systemd \([0-9]*\).*/\1/p') runc=$(runc --version | sed -n '1s/^runc version //p') ip=$(ip -4 -o addr show scope global | sed -n '1s/.* inet \([0-9.]*\)\/.*/\1/p')"
