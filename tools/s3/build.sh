#!/usr/bin/env bash
# Build the S3 server that benchmarks/checkpoint_io.py compares the checkpoint store against
# (gofakes3 over a folder on disk; main.go beside this script) from Go modules. The binary goes
# to ${AIRFLOW_SPOT_S3_CACHE:-~/.cache/airflow-spot/s3}/<hash of main.go, go.mod, go.sum>/s3server:
# one already there is not rebuilt (a warm run does nothing), and a change to the sources builds
# a new one. Go's module and build caches stay in their default places outside the repository.
# Prints the binary's path on its last line. Usage: tools/s3/build.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export GOWORK=off GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
sum=$(cat "$here/main.go" "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-12)
bin="${AIRFLOW_SPOT_S3_CACHE:-$HOME/.cache/airflow-spot/s3}/$sum/s3server"
if [ -x "$bin" ]; then echo "s3-build: already built" >&2; echo "$bin"; exit 0; fi
command -v go >/dev/null || { echo "s3-build: no go command on PATH (Go 1.26 builds it)" >&2; exit 1; }
mkdir -p "$(dirname "$bin")"
t0=$SECONDS
echo "s3-build: building s3server (gofakes3) ..." >&2
(cd "$here" && go build -p "${GO_BUILD_P:-$(nproc)}" -trimpath -ldflags "-s -w" -o "$bin.tmp" .)
mv "$bin.tmp" "$bin"
echo "s3-build: built in $((SECONDS - t0)) s" >&2
echo "$bin"
