#!/usr/bin/env bash
# Builds a Kubernetes control plane for tests from the Go module proxy:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet,
# kube-proxy and kwok
# (plus kwok's stage files), at the versions pinned in tools/k8s/go.mod.
#
#   tools/k8s/build.sh            # or: make k8s
#
# Output: ${AMF_K8S_CACHE:-${XDG_CACHE_HOME:-~/.cache}/amf/k8s}/<k8s-version>/bin/  (lab/controlplane
# looks there, or in $AMF_K8S_BIN). A binary already built from the same go.mod,
# go.sum and flags is skipped, so a second run takes a second. Cold: ~11 min on
# 2 cores, ~2.5 GB RAM per link. Set GOFLAGS=-p=1 when memory is short.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$here"
export CGO_ENABLED=0
export GOFLAGS="${GOFLAGS:-} -mod=readonly -buildvcs=false"

modver() { go list -m -f '{{.Version}}' "$1"; }
k8s="$(modver k8s.io/kubernetes)"
etcd="$(modver go.etcd.io/etcd/server/v3)"
kwok="$(modver sigs.k8s.io/kwok)"
# `go list -m` names a module's folder only once it is in the module cache: on a
# fresh machine (or CI's empty GOMODCACHE) download kwok first, or .Dir is empty.
go mod download sigs.k8s.io/kwok
kwokdir="$(go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
[ -d "$kwokdir/kustomize/stage" ] || { echo "k8s: kwok's module has no kustomize/stage at '$kwokdir'" >&2; exit 1; }
builddate="$(go list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' k8s.io/kubernetes)"
major="${k8s#v}"; major="${major%%.*}"
minor="${k8s#v*.}"; minor="${minor%%.*}"

# One build per machine, shared by every clone (CI clones afresh).
cache="${AMF_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/amf/k8s}"
out="$cache/$k8s/bin"
mkdir -p "$out"
exec 9>"$cache/$k8s/.lock"
flock 9 # one build per version at a time

kver="-X k8s.io/component-base/version.gitVersion=$k8s -X k8s.io/component-base/version.gitMajor=$major"
kver+=" -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
kver+=" -X k8s.io/component-base/version.buildDate=${builddate:-1970-01-01T00:00:00Z}"
# name | package | version ldflags
targets=(
  "etcd|go.etcd.io/etcd/server/v3|-X go.etcd.io/etcd/api/v3/version.GitSHA=$etcd"
  "kube-apiserver|k8s.io/kubernetes/cmd/kube-apiserver|$kver"
  "kube-controller-manager|k8s.io/kubernetes/cmd/kube-controller-manager|$kver"
  "kube-scheduler|k8s.io/kubernetes/cmd/kube-scheduler|$kver"
  "kubectl|k8s.io/kubernetes/cmd/kubectl|$kver"
  "kubelet|k8s.io/kubernetes/cmd/kubelet|$kver"
  "kube-proxy|k8s.io/kubernetes/cmd/kube-proxy|$kver"
  "kwok|sigs.k8s.io/kwok/cmd/kwok|-X sigs.k8s.io/kwok/pkg/consts.Version=${kwok#v} -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${k8s#v}"
)

inputs="$(cat go.mod go.sum; go version)"
start=$SECONDS
for t in "${targets[@]}"; do
  IFS='|' read -r name pkg ldf <<<"$t"
  stamp="$(printf '%s\n%s\n%s\n' "$inputs" "$pkg" "$ldf" | sha256sum | cut -d' ' -f1)"
  if [ -x "$out/$name" ] && [ "$(cat "$out/.$name.stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "k8s: $name up to date"
    continue
  fi
  t0=$SECONDS
  echo "k8s: building $name ($pkg)"
  go build -trimpath -ldflags "-s -w $ldf" -o "$out/$name.tmp" "$pkg"
  mv -f "$out/$name.tmp" "$out/$name"
  echo "$stamp" >"$out/.$name.stamp"
  echo "k8s: built $name in $((SECONDS - t0))s"
done

# kwok's stages (what fake nodes and pods go through), as its module ships them.
rm -rf "$out/kwok-stage.tmp"
mkdir -p "$out/kwok-stage.tmp"
(cd "$kwokdir/kustomize/stage" &&
  find . -name '*.yaml' ! -path '*/testdata/*' ! -name kustomization.yaml -print0 |
  xargs -0 cp --parents -t "$out/kwok-stage.tmp")
chmod -R u+w "$out/kwok-stage.tmp"
rm -rf "$out/kwok-stage"
mv "$out/kwok-stage.tmp" "$out/kwok-stage"

echo "k8s: Kubernetes $k8s, etcd $etcd, kwok $kwok in $out ($((SECONDS - start))s)"
"$out/kube-apiserver" --version
echo "k8s: kwok stages in $out/kwok-stage"
echo "k8s: tests find them there; elsewhere: export AMF_K8S_BIN=$out"
