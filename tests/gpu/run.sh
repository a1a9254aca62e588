#!/usr/bin/env bash
# Runs the GPU checks on a machine with NVIDIA GPUs and says what it checked. Not run in CI or on the development
# machine (no GPU there): CI only compiles and links the CUDA/NCCL path.
#   tests/gpu/run.sh [build-dir]     (default: build-gpu next to this repo's root)
# Checks, in order:
#   1. the NCCL backend of worker/comm (ctest worker_comm_nccl: all-reduce over every GPU, up to 4, checked on the host)
#   2. every test labelled `gpu` (the CPU-vs-GPU equivalence tests of the worker register under that label)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-gpu}

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "tests/gpu/run.sh: no usable NVIDIA GPU (nvidia-smi -L failed); nothing checked" >&2
  exit 2
fi
echo "GPUs:"; nvidia-smi -L

cmake -S "$root" -B "$build" -DRAILYARD_CUDA=ON >/dev/null
cmake --build "$build" -j"$(nproc)" --target worker_comm_nccl
checked=()
(cd "$build" && ctest -R '^worker_comm_nccl$' --output-on-failure) && checked+=("worker/comm NCCL backend: all_reduce + barrier over every GPU")
if (cd "$build" && ctest -N -L gpu | grep -q 'Total Tests: [1-9]'); then
  cmake --build "$build" -j"$(nproc)"
  (cd "$build" && ctest -L gpu --output-on-failure) && checked+=("tests labelled gpu: $(cd "$build" && ctest -N -L gpu | grep -c 'Test #')")
fi
echo "checked:"
printf '  - %s\n' "${checked[@]}"
