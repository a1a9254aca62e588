#!/usr/bin/env bash
# Runs the GPU checks and the GPU throughput benchmark on a machine with NVIDIA GPUs and says what it checked. Not run
# in CI or on the development machine (no GPU there): CI only compiles and links the CUDA/NCCL path. See docs/gpu.md.
#   tests/gpu/run.sh [build-dir]     (default: build-gpu next to this repo's root)
# Checks, in order:
#   1. the NCCL backend of worker/comm: ctest worker_comm_nccl (all-reduce over every GPU, up to 4) and, with 2 or more
#      GPUs, worker_comm_nccl_gpu (every Communicator operation over NCCL equals the Gloo backend's result on the same
#      inputs, in the world and in split groups; the watchdog aborts a collective a rank never joins and names it;
#      nccl_stream_reducer, the data-parallel buckets' reducer, orders its all-reduces after another stream's writes).
#      NCCL's bootstrap stays on 127.0.0.1: the tests set NCCL_COMM_ID to a loopback port and NCCL_SOCKET_IFNAME=lo.
#   2. the CUDA kernels: ctest worker_cuda_unit (launch plans, device selection) and worker_cuda_parity (every kernel
#      of worker/kernels/cuda against its CPU twin on random inputs; fp32 kernels to 1e-5, bf16 cuBLASLt GEMMs to 1e-3;
#      whole Gpt<float> steps, dense and with experts, against the CPU).
#   2b. with 2+ GPUs, worker_cuda_stage_nccl: the tensor/pipeline-parallel model (ParallelModel on CudaKernels, NCCL
#      groups) at tp=2, pp=2 and, with 4+ GPUs, tp=2 x pp=2 against the same layout on the CPU over Gloo.
#   3. with 2 or more GPUs, worker_train_dp_cuda: `railyard-worker train --nproc 2 --device cuda` (gradient buckets
#      all-reduced over NCCL on a communication stream, overlapping backward) trains to the losses of the same job on
#      the CPU over Gloo within 2% per step (bf16 GEMM operands), and `--deterministic --device cuda` at --nproc 2
#      (also --zero 2) bitwise equal to one process on the GPU, and a model with experts (MoE layers on the device, with
#      and without ZeRO-1) within 3% of the CPU run; with 4 or more GPUs, worker_train_dp_tp_cuda: the same
#      for `--nproc 4` with `--tp 2` (dp=2 x tp=2), `--pp 2` (dp=2 x pp=2) and `--tp 2 --zero 1` (ZeRO-1 on device
#      pieces); then every other test labelled `gpu` (the CPU-vs-GPU equivalence tests of the worker register under
#      that label).
#   4. the throughput benchmark: `railyard-worker train --device cuda` on GPU 0 for gpt2-124m and gpt2-350m (T=1024,
#      random-init weights, this repo's docs as the token data), tokens/s and MFU against the GPU's dense bf16 peak
#      (A100 312, H100 SXM / H200 989, H100 NVL 835, H100 PCIe 756 TFLOP/s; RAILYARD_PEAK_TFLOPS overrides, and is
#      required for other GPUs), printed as a table. Median over the steps after the first 3 (warm-up).
#      `--device` is the trainer flag of issue #11's device abstraction (branch h/gpudev at the time of writing).
# A test that CTest reports as Skipped counts as failed here (there is a GPU); worker_comm_nccl_gpu and
# worker_train_dp_cuda on a 1-GPU machine (worker_train_dp_tp_cuda below 4 GPUs) are listed as "not run" instead
# (NCCL needs one GPU per rank).
# Environment: BENCH=0 skips 4; BENCH_STEPS (default 20); BENCH_BATCH_124M (default 16), BENCH_BATCH_350M (default 8):
# sequences per step (no gradient accumulation); RAILYARD_PEAK_TFLOPS: the peak MFU is measured against.
# Exit status: 0 when everything checked passed, 1 when a check failed, 2 when there is no GPU.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-gpu}

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "tests/gpu/run.sh: no usable NVIDIA GPU (nvidia-smi -L failed); nothing checked, nothing measured" >&2
  exit 2
fi
echo "GPUs:"
nvidia-smi -L
gpus=$(nvidia-smi -L | grep -c '^GPU ')
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | head -1)
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader -i 0 | head -1)

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DRAILYARD_CUDA=ON >/dev/null
cmake --build "$build" -j"$(nproc)" --target worker_comm_nccl worker_comm_nccl_gpu worker_cuda_unit worker_cuda_parity \
  worker_cuda_stage_nccl worker_train_dp_cuda worker_train_dp_tp_cuda railyard-worker railyard
checked=()
failed=()
not_run=()
run() { # run <description> <ctest args...>: a skipped test counts as failed here (there is a GPU)
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
# run_with_gpus N TEST DESCRIPTION: runs ctest's TEST (as run does) on a machine with N GPUs or more, else lists it as
# not run, saying why.
run_with_gpus() {
  if [ "$gpus" -ge "$1" ]; then
    run "$3" -R "^$2\$"
  else
    not_run+=("$2: needs $1 GPUs, this machine has $gpus")
  fi
}
run "worker/comm NCCL backend: all_reduce over every GPU" -R '^worker_comm_nccl$'
run_with_gpus 2 worker_comm_nccl_gpu \
  "worker/comm NCCL backend: every operation equals Gloo's; the watchdog aborts and names a hung all_reduce"
run "worker/kernels/cuda launch plans and device selection" -R '^worker_cuda_unit$'
run "worker/kernels/cuda parity with the CPU kernels (all kernels, cuBLASLt GEMMs)" -R '^worker_cuda_parity$'
run_with_gpus 2 worker_cuda_stage_nccl \
  "worker/parallel on CUDA over NCCL: tp=2, pp=2 (tp=2 x pp=2 with 4+ GPUs) equal the CPU layout"
run_with_gpus 2 worker_train_dp_cuda \
  "data parallelism on CUDA: train --nproc 2 --device cuda over NCCL equals the CPU/Gloo run within 2%"
run_with_gpus 4 worker_train_dp_tp_cuda \
  "dp x tp/pp on CUDA: train --nproc 4 --tp 2, --pp 2, --tp 2 --zero 1 (dp=2 over NCCL) equal the CPU layouts within 2%"
others='^(worker_cuda_parity|worker_comm_nccl_gpu|worker_cuda_stage_nccl|worker_train_dp_cuda|worker_train_dp_tp_cuda)$'
if (cd "$build" && ctest -N -L gpu -E "$others" | grep -q 'Total Tests: [1-9]'); then
  cmake --build "$build" -j"$(nproc)"
  run "other tests labelled gpu: $(cd "$build" && ctest -N -L gpu -E "$others" | grep -c 'Test #')" -L gpu -E "$others"
fi

# Dense bf16 tensor-core peak of one GPU in TFLOP/s, from the name nvidia-smi reports; empty when unknown.
peak_tflops() {
  case "$1" in
    *H200*) echo 989 ;;
    *H100*PCIe*) echo 756 ;;
    *H100*NVL*) echo 835 ;;
    *H100*) echo 989 ;; # SXM ("NVIDIA H100 80GB HBM3")
    *A100*) echo 312 ;;
    *) echo "" ;;
  esac
}

# median of the numbers on stdin
median() { sort -g | awk '{v[NR]=$1} END {if (NR == 0) exit 1; print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
# json_field FIELD FILE: the values of "FIELD": in the step lines of a --log-json file, after the first 3 steps
json_field() {
  grep '"event":"step"' "$2" | tail -n +4 | grep -o "\"$1\":[-0-9.eE+]*" | cut -d: -f2
}

if [ "${BENCH:-1}" != 0 ]; then
  peak=${RAILYARD_PEAK_TFLOPS:-$(peak_tflops "$gpu_name")}
  if [ -z "$peak" ]; then
    failed+=("benchmark: no known dense bf16 peak for '$gpu_name'; set RAILYARD_PEAK_TFLOPS")
  else
    work=$(mktemp -d /tmp/railyard-gpu-bench.XXXXXX)
    trap 'rm -rf "$work"' EXIT
    "$build/bin/railyard" data prepare --input "$root"/docs/*.md "$root"/README.md --output "$work/data" >/dev/null
    steps=${BENCH_STEPS:-20}
    rows=()
    for model in gpt2-124m gpt2-350m; do
      case $model in
        gpt2-124m) batch=${BENCH_BATCH_124M:-16} ;;
        *) batch=${BENCH_BATCH_350M:-8} ;;
      esac
      log="$work/$model.jsonl"
      echo "benchmark: $model, batch $batch x 1024 tokens, $steps steps on GPU 0 ($gpu_name)"
      if CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} "$build/bin/railyard-worker" train --device cuda \
        --model "$model" --data "$work/data" --batch "$batch" --seq 1024 --steps "$steps" --warmup 0 \
        --peak-flops "${peak}e12" --log-json "$log" >"$work/$model.out" 2>&1 &&
        tps=$(json_field tokens_per_s "$log" | median) && mfu=$(json_field mfu "$log" | median); then
        rows+=("$(printf '| %-10s | %5s x 1024 | %12.0f | %6.1f%% |' "$model" "$batch" "$tps" "$(awk -v m="$mfu" 'BEGIN {print 100 * m}')")")
        checked+=("benchmark $model")
      else
        tail -n 20 "$work/$model.out" >&2
        failed+=("benchmark $model (railyard-worker train --device cuda failed or logged fewer than 4 steps)")
      fi
    done
    echo
    echo "Throughput on $gpu_name (driver $driver), dense bf16 peak $peak TFLOP/s, $(date -u +%Y-%m-%d):"
    echo "| model      | batch x seq  |     tokens/s |    MFU |"
    echo "|------------|--------------|--------------|--------|"
    printf '%s\n' "${rows[@]}"
    echo "(MFU: the trainer's FLOP/s (docs/worker.md, flops_per_token) over the peak; goal: gpt2-124m >= 45% on one H100)"
  fi
fi

echo "checked:"
printf '  - %s\n' "${checked[@]}"
if [ ${#not_run[@]} -gt 0 ]; then
  echo "not run:"
  printf '  - %s\n' "${not_run[@]}"
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED:"
  printf '  - %s\n' "${failed[@]}"
  exit 1
fi
