#!/usr/bin/env bash
# Checkpoint benchmark, one run for issue 6's numbers: (1) bench_checkpoint: snapshot stall, persist throughput beside
# dd (conv=fsync, same directory), restore from shared memory vs disk, for gpt2-124m and gpt2-350m sized state;
# (2) bench_trainer_stall: the real trainer's step time without checkpoints and the time its steps wait for a save
# (sync and async), spread over the default interval of 100 steps; (3) trainer_restore.sh: the worker's restore at
# start from the in-memory tier vs disk. Needs ~14 GB of free RAM for gpt2-350m (state, snapshot buffer, two
# shared-memory slots in step 3). STALL=0 / RESTORE=0 skip (2) / (3); MODELS="gpt2-124m" limits the models.
# usage: tests/bench/checkpoint/run.sh [BUILD_DIR] [CKPT_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
build=${1:-$root/build}
dir=${2:-${TMPDIR:-/tmp}/railyard-ckpt-bench.$$}
models=${MODELS:-gpt2-124m gpt2-350m}
cmake --build "$build" -j2 --target bench_checkpoint bench_trainer_stall railyard-worker railyard >/dev/null
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores; RAM $(free -g | awk '/Mem:/{print $2}') GiB"
echo "load average at start: $(cut -d" " -f1-3 /proc/loadavg)"
echo "filesystem of $dir: $(mkdir -p "$dir" && df -T "$dir" | awk 'NR==2{print $1" "$2}')"
trap 'rm -rf "$dir"' EXIT
margs=()
for m in $models; do margs+=(--model "$m"); done
echo "== bench_checkpoint"
"$build/bin/bench_checkpoint" --dir "$dir" "${margs[@]}"
if [ "${STALL:-1}" != 0 ]; then
  for m in $models; do
    echo "== bench_trainer_stall $m (load average $(cut -d" " -f1-3 /proc/loadavg))"
    "$build/bin/bench_trainer_stall" --model "$m" --steps 6 --every 3 --rounds 1 --threads 2 --dir "$dir/stall"
  done
fi
if [ "${RESTORE:-1}" != 0 ]; then
  for m in $models; do
    echo "== trainer_restore.sh $m (load average $(cut -d" " -f1-3 /proc/loadavg))"
    TMPDIR=$dir bash "$here/trainer_restore.sh" "$build" "$m" 2
  done
fi
echo "load average at the end: $(cut -d" " -f1-3 /proc/loadavg)"
