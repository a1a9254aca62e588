#!/usr/bin/env bash
# Runs the GPU checks on a machine with NVIDIA GPUs and says what it checked. Not run in CI or on the development
# machine (no GPU there): CI only compiles and links the CUDA/NCCL path.
#   tests/gpu/run.sh [build-dir]     (default: build-gpu next to this repo's root)
# Checks, in order:
#   1. the NCCL backend of worker/comm (ctest worker_comm_nccl: all-reduce over every GPU, up to 4, checked on the host)
#   2. the CUDA kernels: ctest worker_cuda_unit (launch plans, device selection) and worker_cuda_parity (every kernel
#      of worker/kernels/cuda against its CPU twin on random inputs; fp32 kernels to 1e-5, bf16 cuBLASLt GEMMs to 1e-3).
#      worker_cuda_parity exits 77 (CTest: Skipped) when it sees no GPU; here a skip counts as a failure.
#   3. every other test labelled `gpu` (the CPU-vs-GPU equivalence tests of the worker register under that label)
# Exit status: 0 when everything checked passed, 1 when a check failed, 2 when there is no GPU.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-gpu}

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "tests/gpu/run.sh: no usable NVIDIA GPU (nvidia-smi -L failed); nothing checked" >&2
  exit 2
fi
echo "GPUs:"; nvidia-smi -L

cmake -S "$root" -B "$build" -DRAILYARD_CUDA=ON >/dev/null
cmake --build "$build" -j"$(nproc)" --target worker_comm_nccl worker_cuda_unit worker_cuda_parity
checked=()
failed=()
run() {  # run <description> <ctest args...>: a skipped test counts as failed here (there is a GPU)
  local what=$1
  shift
  local out
  if out=$(cd "$build" && ctest --output-on-failure --no-tests=error "$@" 2>&1) && ! grep -q 'Skipped\|Not Run' <<<"$out"; then
    checked+=("$what")
  else
    failed+=("$what")
  fi
  printf '%s\n' "$out"
}
run "worker/comm NCCL backend: all_reduce + all_gather over every GPU" -R '^worker_comm_nccl$'
run "worker/kernels/cuda launch plans and device selection" -R '^worker_cuda_unit$'
run "worker/kernels/cuda parity with the CPU kernels (all kernels, cuBLASLt GEMMs)" -R '^worker_cuda_parity$'
if (cd "$build" && ctest -N -L gpu -E '^worker_cuda_parity$' | grep -q 'Total Tests: [1-9]'); then
  cmake --build "$build" -j"$(nproc)"
  run "other tests labelled gpu: $(cd "$build" && ctest -N -L gpu -E '^worker_cuda_parity$' | grep -c 'Test #')" \
    -L gpu -E '^worker_cuda_parity$'
fi
echo "checked:"
printf '  - %s\n' "${checked[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED:"
  printf '  - %s\n' "${failed[@]}"
  exit 1
fi
