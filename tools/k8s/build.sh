#!/usr/bin/env bash
# Build the real Kubernetes control plane used by the test suite (issue 20) from Go modules.
# Binaries go to ${AIRFLOW_SPOT_K8S_CACHE:-~/.cache/airflow-spot/k8s}/<version>/bin; a binary that is
# already there is not rebuilt, so a warm run does nothing. Go's module and build caches stay in their
# default places outside the repository, so a rebuild after a go.mod change mostly relinks.
# Karpenter's operator binds its metrics and health servers to ":<port>" (every interface) with no
# flag to change it, and the tests bind 127.0.0.1 only: karpenter-kwok is built from a copy of the
# module, patched to "127.0.0.1:<port>", through a replace in a build module under the cache.
# The same copy gets the test cloud's emulated insufficient capacity (patches/kwok_ice.go: a
# launch fails with an InsufficientCapacityError for the offerings a rules file names).
# Usage: tools/k8s/build.sh [name ...]   (default: etcd kube-apiserver kube-controller-manager kube-scheduler kwok karpenter-kwok)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KV=v1.34.4
cache="${AIRFLOW_SPOT_K8S_CACHE:-$HOME/.cache/airflow-spot/k8s}/$KV"
bin="$cache/bin"
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

# karpenter-kwok, its operator's servers on 127.0.0.1 and the kwok provider able to emulate
# insufficient capacity and to launch reserved offerings. The stamp beside the binary says it was built with both patches (a
# binary without it, from an earlier version of this script, is rebuilt).
KARPENTER=sigs.k8s.io/karpenter
OPERATOR_GO=pkg/operator/operator.go
KWOK_CP_GO=kwok/cloudprovider/cloudprovider.go
build_karpenter() {
  local name=karpenter-kwok stamp="$bin/karpenter-kwok.loopback-ice-reserved"
  if [ -x "$bin/$name" ] && [ -f "$stamp" ]; then
    echo "k8s-build: $name already built ($bin/$name, servers on 127.0.0.1, emulated ICE)"; return 0
  fi
  [ -x "$bin/$name" ] && echo "k8s-build: $bin/$name has no $stamp (built without a patch): rebuilding"
  local t0=$SECONDS src mod ver
  (cd "$here/karpenter" && go mod download "$KARPENTER")  # a fresh module cache has no copy yet
  read -r ver src < <(cd "$here/karpenter" && go list -m -f '{{.Version}} {{.Dir}}' "$KARPENTER")
  [ -n "$src" ] && [ -f "$src/$OPERATOR_GO" ] || {
    echo "k8s-build: $KARPENTER not in the module cache ($src)" >&2; exit 1; }
  mod="$cache/src/karpenter@$ver-loopback"
  echo "k8s-build: building $name from a copy of $KARPENTER@$ver patched to bind 127.0.0.1 ($mod) ..."
  rm -rf "$mod" "$cache/src/karpenter-build"
  mkdir -p "$cache/src/karpenter-build"
  cp -R "$src" "$mod"
  chmod -R u+w "$mod"
  local before after
  before=$(grep -c 'fmt.Sprintf(":%d", options.FromContext(ctx).\(MetricsPort\|HealthProbePort\))' "$mod/$OPERATOR_GO" || true)
  if [ "$before" != 2 ]; then
    echo "k8s-build: expected the metrics and health bind addresses 'fmt.Sprintf(\":%d\", ...Port)' twice in" \
      "$KARPENTER@$ver/$OPERATOR_GO, found $before: the patch no longer applies; see its lines near 'BindAddress'" >&2
    exit 1
  fi
  sed -i 's/fmt.Sprintf(":%d", options.FromContext(ctx).\(MetricsPort\|HealthProbePort\))/fmt.Sprintf("127.0.0.1:%d", options.FromContext(ctx).\1)/' \
    "$mod/$OPERATOR_GO"
  after=$(grep -c 'fmt.Sprintf("127.0.0.1:%d", options.FromContext(ctx).\(MetricsPort\|HealthProbePort\))' "$mod/$OPERATOR_GO" || true)
  if [ "$after" != 2 ] || grep -q 'fmt.Sprintf(":%d"' "$mod/$OPERATOR_GO"; then
    echo "k8s-build: patching $mod/$OPERATOR_GO failed (found $after patched lines)" >&2; exit 1
  fi
  patch_ice "$mod"
  cp "$here/karpenter/go.mod" "$here/karpenter/go.sum" "$cache/src/karpenter-build/"
  (cd "$cache/src/karpenter-build" && go mod edit -replace "$KARPENTER=$mod" &&
    go build -p "$P" -trimpath -ldflags "-s -w" -o "$bin/$name.tmp" "$KARPENTER/kwok")
  mv "$bin/$name.tmp" "$bin/$name"
  printf '%s\n' "$KARPENTER@$ver $OPERATOR_GO: metrics and health servers on 127.0.0.1" \
    "$KARPENTER@$ver $KWOK_CP_GO: Create and GetInstanceTypes wrapped by patches/kwok_ice.go" \
    "$KARPENTER@$ver kwok/cloudprovider: cloudprovider.ReservationIDLabel set (patches/kwok_ice.go)" > "$stamp"
  echo "k8s-build: $name built in $((SECONDS - t0)) s"
}

# The kwok provider's Create and GetInstanceTypes renamed, and wrapped by patches/kwok_ice.go
# (the test cloud's insufficient capacity, off unless $AIRFLOW_SPOT_KWOK_ICE_FILE is set).
patch_ice() {
  local mod=$1 f="$1/$KWOK_CP_GO" m
  for m in Create GetInstanceTypes; do
    if [ "$(grep -c "^func (c CloudProvider) $m(" "$f" || true)" != 1 ]; then
      echo "k8s-build: expected one 'func (c CloudProvider) $m(' in $KWOK_CP_GO: the ICE patch" \
        "no longer applies" >&2; exit 1
    fi
  done
  sed -i -e 's/^func (c CloudProvider) Create(/func (c CloudProvider) createUpstream(/' \
    -e 's/^func (c CloudProvider) GetInstanceTypes(/func (c CloudProvider) getInstanceTypesUpstream(/' "$f"
  cp "$here/patches/kwok_ice.go" "$mod/kwok/cloudprovider/airflow_spot_ice.go"
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
    karpenter-kwok) build_karpenter ;;
    *) echo "k8s-build: unknown binary $n" >&2; exit 2 ;;
  esac
done
echo "k8s-build: done in $((SECONDS - t)) s -> $bin"
