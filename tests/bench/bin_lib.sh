# shellcheck shell=bash
# Shared by the benchmarks that run the built railyard-worker and railyard binaries (planner/cpu_step.sh,
# planner/hetero_step.sh, worker/train_vs_torch.sh), sourced with the script's arguments: bin is the binaries'
# folder (the first argument, else $RAILYARD_BIN_DIR, else build/bin of this checkout), and the script exits 1
# naming itself when either binary is missing there.
# shellcheck disable=SC2034  # bin is the script's
bin=${1:-${RAILYARD_BIN_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/build/bin}}
for f in "$bin/railyard-worker" "$bin/railyard"; do
  [ -x "$f" ] || {
    echo "$(basename "$0"): $f missing: build with cmake --build build --target railyard-worker railyard" >&2
    exit 1
  }
done
