#!/usr/bin/env bash
# Informer benchmark: N pending pods, time to sync and RSS growth (docs/benchmarks.md).
#   tests/bench/informer.sh [--state-dir DIR] [--pods N] [--threads T] [--build-dir DIR]
# With --state-dir, talks to that local cluster (deploy/local/cluster.sh up --state-dir DIR); otherwise uses
# $KUBECONFIG. Does not start or stop a cluster itself.
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD_DIR="$REPO_ROOT/build"
STATE_DIR=""
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --state-dir) STATE_DIR="$2"; shift 2 ;;
    --build-dir) BUILD_DIR="$2"; shift 2 ;;
    --pods | --threads) ARGS+=("$1" "$2"); shift 2 ;;
    -h | --help) sed -n '2,5p' "$0"; exit 0 ;;
    *) echo "informer.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
KUBECTL="$(command -v kubectl || true)"
if [ -n "$STATE_DIR" ]; then
  [ -f "$STATE_DIR/kubeconfig" ] || { echo "informer.sh: no cluster in $STATE_DIR (no kubeconfig)" >&2; exit 1; }
  export KUBECONFIG="$STATE_DIR/kubeconfig"
  # The kubectl built with the local cluster matches its version (see docs/local-cluster.md).
  CACHE_BIN="$(sed -n 's/^export CACHE_BIN=//p' "$STATE_DIR/cluster.env" 2>/dev/null || true)"
  [ -x "$CACHE_BIN/kubectl" ] && KUBECTL="$CACHE_BIN/kubectl"
fi
# Baseline: client-go (kubectl) listing the same pods in pages of 500 and holding them to print JSON.
if [ -n "$KUBECTL" ] && [ -x /usr/bin/time ]; then
  ARGS+=(--baseline-cmd "/usr/bin/time -f 'kubectl get pods -o json --chunk-size=500: %e s wall, %U s user, %M KiB max RSS' $KUBECTL get pods -n \"\$BENCH_NAMESPACE\" --chunk-size=500 -o json >/dev/null")
fi
[ -n "${KUBECONFIG:-}" ] || { echo "informer.sh: set KUBECONFIG or pass --state-dir" >&2; exit 1; }
BIN="$BUILD_DIR/bin/bench_informer"
[ -x "$BIN" ] || { echo "informer.sh: $BIN missing; build it: cmake --build $BUILD_DIR --target bench_informer" >&2; exit 1; }
echo "date: $(date -u +%FT%TZ)"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr)"
exec "$BIN" ${ARGS[@]+"${ARGS[@]}"}
