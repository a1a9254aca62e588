#!/usr/bin/env bash
# The trainer's restore at start, from the in-memory tier vs from disk (page cache warm, and cold after
# posix_fadvise(DONTNEED) through `dd iflag=nocache`), side by side in one run: `railyard-worker train` saves one
# step of MODEL to both tiers, then restore-only runs (--steps 1: the restored step is the last one) alternate between
# the tiers, ROUNDS times. Times are the worker's own "checkpoint: restored ... seconds=" (the read, the CRC32C check
# and the copy into the training buffers; not the process start). Needs about 4x the model's fp32 state in free RAM.
# usage: tests/bench/checkpoint/trainer_restore.sh [BUILD_DIR] [MODEL] [ROUNDS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
build=${1:-$root/build}
model=${2:-gpt2-124m}
rounds=${3:-3}
bin=$build/bin
work=$(mktemp -d "${TMPDIR:-/tmp}/railyard-restore-bench.XXXXXX")
export RAILYARD_SHM_PREFIX=/railyard-restore-bench-$$
trap 'rm -rf "$work"; rm -f /dev/shm"$RAILYARD_SHM_PREFIX"-*' EXIT
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores; RAM $(free -g | awk '/Mem:/{print $2}') GiB"
echo "load average at start: $(cut -d" " -f1-3 /proc/loadavg)"
echo "filesystem of $work: $(df -T "$work" | awk 'NR==2{print $1" "$2}')"
"$bin/railyard" data prepare --input /usr/share/common-licenses/* --output "$work/data" >/dev/null
train() {
  "$bin/railyard-worker" train --model "$model" --data "$work/data" --batch 1 --seq 64 --threads 2 --peak-flops 1e12 \
    --ckpt-dir "$work/ck" "$@"
}
train --steps 1 --ckpt-every 1 --ckpt-shm-every 1 >"$work/save.log" 2>&1 || { cat "$work/save.log"; exit 1; }
grep -q "checkpoint:.*" "$work/save.log"
restored() { # LOG -> "SOURCE SECONDS BYTES"
  grep 'checkpoint: restored ' "$1" | sed -E 's/.* from=([^ ]+) bytes=([0-9]+) seconds=([0-9.]+).*/\1 \3 \2/'
}
for r in $(seq 1 "$rounds"); do
  train --steps 1 --ckpt-shm-every 1 --resume auto >"$work/m.log" 2>&1
  read -r src_m sec_m bytes <<<"$(restored "$work/m.log")"
  [ "$src_m" = memory ] || { echo "round $r: memory restore read '$src_m'"; cat "$work/m.log"; exit 1; }
  train --steps 1 --resume auto >"$work/w.log" 2>&1
  read -r src_w sec_w _ <<<"$(restored "$work/w.log")"
  for f in "$work"/ck/step-*/*.bin; do dd if="$f" iflag=nocache count=0 status=none; done
  train --steps 1 --resume auto >"$work/c.log" 2>&1
  read -r src_c sec_c _ <<<"$(restored "$work/c.log")"
  echo "round $r: $model state $bytes bytes: memory $sec_m s, disk warm $sec_w s, disk cold $sec_c s ($src_c)"
done
