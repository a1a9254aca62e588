#!/usr/bin/env bash
# Checkpoint benchmark: snapshot stall, persist throughput beside dd (conv=fsync, same directory), restore from
# shared memory vs disk, for gpt2-124m and gpt2-350m sized state. Needs ~9 GB of free RAM for gpt2-350m.
# usage: tests/bench/checkpoint/run.sh [BUILD_DIR] [CKPT_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
build=${1:-$root/build}
dir=${2:-${TMPDIR:-/tmp}/railyard-ckpt-bench.$$}
cmake --build "$build" -j2 --target bench_checkpoint >/dev/null
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores; RAM $(free -g | awk '/Mem:/{print $2}') GiB"
echo "load average at start: $(cut -d" " -f1-3 /proc/loadavg)"
echo "filesystem of $dir: $(mkdir -p "$dir" && df -T "$dir" | awk 'NR==2{print $1" "$2}')"
trap 'rm -rf "$dir"' EXIT
"$build/bin/bench_checkpoint" --dir "$dir" --model gpt2-124m --model gpt2-350m
