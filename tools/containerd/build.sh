#!/usr/bin/env bash
# Builds containerd 2 (containerd, containerd-shim-runc-v2, ctr) from the Go
# module proxy for the lab's cgroup v2 node (lab/vmnode), at the version pinned
# in tools/containerd/go.mod: static binaries (CGO_ENABLED=0) for each
# architecture asked, amd64 by default.
#
#   tools/containerd/build.sh [amd64] [arm64]      # or: make containerd
#
# Output: ${AMF_CONTAINERD_CACHE:-${XDG_CACHE_HOME:-~/.cache}/amf/containerd}/<version>/<arch>/bin/
# A binary already built from the same go.mod, go.sum and flags is skipped.
# Cold: ≈2 min per architecture on 2 cores.
#
# Debian 12 ships containerd 1.6 only; runc and the CNI plugins in the guest
# are Debian's packages (lab/vmnode's root filesystem), as a k3s or kubeadm
# node on Debian would have them.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:-} -mod=readonly -buildvcs=false"
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(amd64)

ver="$(go list -m -f '{{.Version}}' github.com/containerd/containerd/v2)"
cache="${AMF_CONTAINERD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/amf/containerd}"
mkdir -p "$cache/$ver"
exec 9>"$cache/$ver/.lock"
flock 9

# What kubeadm's and k3s's builds leave out too: the snapshotters a node does
# not use (overlayfs is built in), which need cgo or kernel headers.
tags="no_btrfs,no_devmapper,no_zfs"
ldf="-s -w -X github.com/containerd/containerd/v2/version.Version=$ver -X github.com/containerd/containerd/v2/version.Revision=module-proxy"
inputs="$(cat go.mod go.sum; go version; echo "$tags $ldf")"
for arch in "${archs[@]}"; do
  out="$cache/$ver/$arch/bin"
  mkdir -p "$out"
  for name in containerd containerd-shim-runc-v2 ctr; do
    pkg="github.com/containerd/containerd/v2/cmd/$name"
    stamp="$(printf '%s\n%s\n%s\n' "$inputs" "$pkg" "$arch" | sha256sum | cut -d' ' -f1)"
    if [ -x "$out/$name" ] && [ "$(cat "$out/.$name.stamp" 2>/dev/null)" = "$stamp" ]; then
      echo "containerd: $arch/$name up to date"
      continue
    fi
    t0=$SECONDS
    GOARCH="$arch" go build -trimpath -tags "$tags" -ldflags "$ldf" -o "$out/$name.tmp" "$pkg"
    mv -f "$out/$name.tmp" "$out/$name"
    echo "$stamp" >"$out/.$name.stamp"
    echo "containerd: built $arch/$name $ver in $((SECONDS - t0))s"
  done
done
