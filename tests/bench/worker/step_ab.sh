#!/usr/bin/env bash
# A/B of the trainer's step between two builds of railyard-worker (a refactor must not change speed or bits):
#   tests/bench/worker/step_ab.sh BASE_BIN_DIR HEAD_BIN_DIR   (e.g. a worktree of the old commit's build/bin)
# gpt2-124m, B=4, T=64, 2 threads, 8 steps per run, 4 rounds alternating which side goes first; prints the load
# average before, between rounds and after, per run the median tokens/s of steps 2-8, the medians, spreads, ratio, and
# the final losses (equal bits expected). Record only quiet runs (docs/benchmarks.md).
set -euo pipefail
base=${1:?BASE_BIN_DIR}/railyard-worker; head=${2:?HEAD_BIN_DIR}/railyard-worker
work=$(mktemp -d /tmp/railyard-step-ab-XXXXXX)
trap 'rm -rf "$work"' EXIT
"${2}/railyard" data prepare --input /usr/share/common-licenses/* --output $work/data >/dev/null
load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "load before: $(load)"; lscpu | grep -i "model name" ; grep -o -w 'avx512_bf16\|amx_bf16\|avx512f\|avx2' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
run() { "$1" train --model gpt2-124m --data $work/data --steps ${STEPS:-8} --batch 4 --seq 64 --threads 2 --log-json $work/$2.jsonl >$work/$2.log 2>&1; }
for r in 1 2 3 4; do
  if [ $((r % 2)) = 1 ]; then run $base base$r; run $head head$r; else run $head head$r; run $base base$r; fi
  echo "round $r done, load $(load)"
done
echo "load after: $(load)"
python3 - "$work" <<'PY'
import glob, json, statistics, sys
w = sys.argv[1]
res = {}
for side in ("base", "head"):
    per, losses = [], []
    for f in sorted(glob.glob(f"{w}/{side}*.jsonl")):
        rows = [json.loads(line) for line in open(f) if '"event":"step"' in line]
        per.append(statistics.median([r["tokens_per_s"] for r in rows[1:]]))
        losses.append(rows[-1]["loss"])
    res[side] = per
    print(side, "tokens/s per run:", ["%.1f" % x for x in per], "median %.1f" % statistics.median(per),
          "spread %.1f-%.1f" % (min(per), max(per)), "final loss", sorted(set(losses)))
print("ratio head/base of medians: %.4f" % (statistics.median(res["head"]) / statistics.median(res["base"])))
PY
