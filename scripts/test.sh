#!/usr/bin/env bash
# The test command: installs what is missing, builds everything, and runs every test (unit and e2e; e2e tests
# bring up their own local cluster in build/e2e-cluster and take it down afterwards). Benchmarks are not run.
# Options: --unit (unit tests only), any other argument is passed to ctest (e.g. -R kube).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

labels=(-LE bench)
extra=()
for arg in "$@"; do
  case "$arg" in
    --unit) labels=(-L unit) ;;
    *) extra+=("$arg") ;;
  esac
done

step() { printf '\n== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)"; }

step "dependencies"
bash scripts/install-deps.sh --with-torch

export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache}
# Paths relative to the checkout, so a fresh clone elsewhere reuses the compile cache.
export CCACHE_BASEDIR=$root
step "configure"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >build-configure.log 2>&1 || { cat build-configure.log; exit 1; }
rm -f build-configure.log
step "build"
cmake --build build -j2

if [ "${labels[*]}" != "-L unit" ]; then
  step "local control plane binaries (cached outside the repo)"
  bash deploy/local/cluster.sh build
fi

step "tests"
cd build
# Tests run one at a time: the machine has 2 cores and the trainer tests use both.
ctest --output-on-failure --no-tests=error "${labels[@]}" "${extra[@]}"
