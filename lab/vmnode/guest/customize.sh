#!/bin/sh
# mmdebstrap's customize hook for lab/vmnode's base image: $1 is the root
# filesystem. What changes per run (binaries, certificates, configs, images)
# is on a second disk mounted at /amf, so the base is built once per machine.
set -eu
root="$1"
units="$2"
cp "$units"/*.service "$root/etc/systemd/system/"
for u in amf-node-net amf-node-setup containerd amf-node-images kubelet amf-guestprobe; do
	ln -sf "/etc/systemd/system/$u.service" "$root/etc/systemd/system/multi-user.target.wants/$u.service"
done
# DHCP from qemu's user network on the one NIC, by systemd-networkd; by
# name, as a match by type would take the pods' veths out of the CNI bridge.
mkdir -p "$root/etc/systemd/network"
printf '[Match]\nName=en*\n\n[Network]\nDHCP=ipv4\n' >"$root/etc/systemd/network/10-amf.network"
ln -sf /lib/systemd/system/systemd-networkd.service "$root/etc/systemd/system/multi-user.target.wants/systemd-networkd.service"
mkdir -p "$root/etc/systemd/system/network-online.target.wants"
ln -sf /lib/systemd/system/systemd-networkd-wait-online.service "$root/etc/systemd/system/network-online.target.wants/systemd-networkd-wait-online.service"
printf '/dev/nvme0n1 / ext4 rw,errors=remount-ro 0 1\nLABEL=amf-node /amf ext4 ro,nofail 0 0\n' >"$root/etc/fstab"
mkdir -p "$root/amf"
# What a kubeadm or k3s node loads and sets for pods' networking.
printf 'overlay\nbr_netfilter\nbridge\nveth\n' >"$root/etc/modules-load.d/amf-node.conf"
printf 'net.ipv4.ip_forward = 1\nnet.bridge.bridge-nf-call-iptables = 1\n' >"$root/etc/sysctl.d/90-amf-node.conf"
# No login on the console: the host reads it.
ln -sf /dev/null "$root/etc/systemd/system/serial-getty@ttyS0.service"
ln -sf /dev/null "$root/etc/systemd/system/getty@tty1.service"
echo amf-vmnode >"$root/etc/hostname"
