#!/usr/bin/env bash
# Benchmark: the planner's balanced data-parallel split on mixed-speed replicas, measured.
# Two ranks of `railyard-worker train --nproc 2` (one thread each); rank 1 is slowed by the test knob
# `--slow-ranks 1 --slow-factor F` (it sleeps (F-1) x each micro-batch's forward+backward, as a device F times slower
# would). The even split (G/2 micro-batches each) and the split `railyard plan --mixed` gives for a fast and an
# F-times-slower profile (`--dp-split`) run ROUNDS times each, alternately (side by side under the same load), and
# the median wall time per step (first step dropped) is compared with the planner's even and balanced steps.
# The planner's profiles: `railyard plan --calibrate --threads 1` of this machine, and a copy with peak FLOP/s and
# memory bandwidth divided by F and the kernel overhead multiplied by F (the knob slows compute, not the all-reduce).
# Fails when the balanced split is not at least MIN_SPEEDUP x faster than the even one (measured).
# Usage: tests/bench/planner/hetero_step.sh [BIN_DIR]   (env: STEPS=5 ROUNDS=3 F=2 MIN_SPEEDUP=1.15)
set -euo pipefail
# shellcheck source=../bin_lib.sh
source "$(dirname "$0")/../bin_lib.sh" "$@"
STEPS=${STEPS:-5}
ROUNDS=${ROUNDS:-3}
F=${F:-2}
MIN_SPEEDUP=${MIN_SPEEDUP:-1.15}
work=$(mktemp -d /tmp/railyard-hetero-bench-XXXXXX)
trap 'rm -rf "$work"' EXIT
"$bin/railyard" data prepare --input /usr/share/common-licenses/* --output "$work/data" >/dev/null
"$bin/railyard" plan --calibrate --threads 1 --output "$work/fast.yaml" 2>/dev/null
/usr/bin/python3 - "$work/fast.yaml" "$work/slow.yaml" "$F" <<'PY'
import re, sys
src, dst, f = sys.argv[1], sys.argv[2], float(sys.argv[3])
out = []
for line in open(src):
    m = re.match(r'^(peak_flops|memory_bandwidth|kernel_overhead_s): \{value: ([0-9.eE+-]+), source: "(.*)"\}$', line)
    if m:
        k, v = m.group(1), float(m.group(2))
        v = v * f if k == "kernel_overhead_s" else v / f
        line = f'{k}: {{value: {v:.6g}, source: "measured, then slowed {f:g}x by hetero_step.sh ({m.group(3)[:60]})"}}\n'
    elif line.startswith("name:"):
        line = "name: cpu-slow\n"
    elif line.startswith("aliases:"):
        line = "aliases: [cpu-slow]\n"
    out.append(line)
open(dst, "w").writelines(out)
PY
# tiny at T 128, micro-batch 2, 12 micro-batches per step (24 sequences).
MODEL=(--layers 4 --hidden 128 --heads 4 --seq 128 --vocab 256)
G=24 MB=2 T=128
"$bin/railyard" plan "${MODEL[@]}" --global-batch $G --mixed "$work/fast.yaml:1,$work/slow.yaml:1" --tp 1 --pp 1 \
  --micro-batch $MB --json > "$work/plan.json"
split=$(/usr/bin/python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['balancedMicroBatchesPerReplica'])))" "$work/plan.json")
micro=$((G / MB))
even="$((micro / 2)),$((micro / 2))"
echo "planner: even split $even, balanced split $split; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
run() {  # name split round
  "$bin/railyard-worker" train --model tiny --data "$work/data" --steps "$STEPS" --batch $MB --seq $T \
    --global-batch $((G * T)) --threads 1 --nproc 2 --dp-split "$2" --slow-ranks 1 --slow-factor "$F" \
    --log-json "$work/$1-$3.jsonl" > "$work/$1-$3.log" 2>&1 \
    || { echo "hetero_step.sh: railyard-worker failed ($1):" >&2; tail -5 "$work/$1-$3.log" >&2; exit 1; }
}
for r in $(seq 1 "$ROUNDS"); do run even "$even" "$r"; run balanced "$split" "$r"; done
/usr/bin/python3 - "$work" "$ROUNDS" "$MIN_SPEEDUP" "$even" "$split" <<'PY'
import json, statistics, sys
work, rounds, need, even_split, bal_split = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
plan = json.load(open(f"{work}/plan.json"))
def steps(name):
    out = []
    for r in range(1, rounds + 1):
        rows = [json.loads(l) for l in open(f"{work}/{name}-{r}.jsonl") if '"event":"step"' in l.replace(" ", "")]
        out += [s["step_ms"] / 1e3 for s in rows[1:]]
    return statistics.median(out), out
even, even_all = steps("even")
bal, bal_all = steps("balanced")
res = {"even_split": even_split, "balanced_split": bal_split,
       "measured_even_s": round(even, 4), "measured_balanced_s": round(bal, 4),
       "measured_speedup": round(even / bal, 3),
       "predicted_even_s": round(plan["evenStepSeconds"], 4), "predicted_balanced_s": round(plan["balancedStepSeconds"], 4),
       "predicted_speedup": round(plan["speedup"], 3),
       "even_steps_s": [round(x, 3) for x in even_all], "balanced_steps_s": [round(x, 3) for x in bal_all]}
print(json.dumps(res))
ok = even / bal >= need
print(f"balanced {bal_split} vs even {even_split}: measured {even / bal:.2f}x (predicted {plan['speedup']:.2f}x) "
      f"-> {'ok' if ok else 'FAIL'} (needs >= {need}x)")
sys.exit(0 if ok else 1)
PY
