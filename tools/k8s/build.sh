#!/usr/bin/env bash
# Build the real Kubernetes control plane used by the test suite (issue 20) from Go modules.
# Binaries go to ${AIRFLOW_SPOT_K8S_CACHE:-~/.cache/airflow-spot/k8s}/<version>/bin; a binary that is
# already there is not rebuilt, so a warm run does nothing. Go's module and build caches stay in their
# default places outside the repository, so a rebuild after a go.mod change mostly relinks.
# Usage: tools/k8s/build.sh [name ...]   (default: etcd kube-apiserver kube-controller-manager kube-scheduler kwok karpenter-kwok)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KV=v1.34.4
bin="${AIRFLOW_SPOT_K8S_CACHE:-$HOME/.cache/airflow-spot/k8s}/$KV/bin"
mkdir -p "$bin"
export GOWORK=off GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
P="${GO_BUILD_P:-$(nproc)}"
LDK="-s -w -X k8s.io/component-base/version.gitVersion=$KV -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=34 -X k8s.io/client-go/pkg/version.gitVersion=$KV \
 -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"

build() {  # name moduledir package ldflags
  local name=$1 dir=$2 pkg=$3 ld=$4
  if [ -x "$bin/$name" ]; then echo "k8s-build: $name already built ($bin/$name)"; return 0; fi
  local t0=$SECONDS
  echo "k8s-build: building $name from $pkg ..."
  (cd "$here/$dir" && go build -p "$P" -trimpath -ldflags "$ld" -o "$bin/$name.tmp" "$pkg")
  mv "$bin/$name.tmp" "$bin/$name"
  echo "k8s-build: $name built in $((SECONDS - t0)) s"
}

names=("$@")
[ ${#names[@]} -eq 0 ] && names=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok karpenter-kwok)
t=$SECONDS
for n in "${names[@]}"; do
  case $n in
    etcd) build etcd etcd go.etcd.io/etcd/server/v3 "-s -w" ;;
    kube-apiserver|kube-controller-manager|kube-scheduler|kubectl)
      build "$n" kubernetes "k8s.io/kubernetes/cmd/$n" "$LDK" ;;
    kwok) build kwok kwok sigs.k8s.io/kwok/cmd/kwok "-s -w" ;;
    karpenter-kwok) build karpenter-kwok karpenter sigs.k8s.io/karpenter/kwok "-s -w" ;;
    *) echo "k8s-build: unknown binary $n" >&2; exit 2 ;;
  esac
done
echo "k8s-build: done in $((SECONDS - t)) s -> $bin"
