# Imports the lab's image archives into containerd (no registry is reachable).
set -eu
n=0
for a in /amf/images/*.tar; do
	[ -e "$a" ] || continue
	ctr --namespace k8s.io images import --all-platforms --snapshotter overlayfs "$a" >/dev/null
	n=$((n + 1))
done
echo "amf-vmnode: images imported=$n"
