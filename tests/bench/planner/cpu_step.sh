#!/usr/bin/env bash
# Benchmark: the planner's predicted CPU step times against what railyard-worker measures, in the same run.
# 1. `railyard plan --calibrate` measures this machine's kernels and Gloo loopback all-reduce into two CPU profiles:
#    one process with THREADS threads, and one with THREADS/2 (the per-process share when two processes run);
# 2. `railyard-worker train [--nproc dp]` runs STEPS steps of each layout (first step dropped, median of the rest of
#    rank 0's per-thread CPU time per step: the calibration times kernels by the same clock, so that other load on a
#    shared machine disturbs neither much);
# 3. `railyard plan --gpu <profile> --gpus dp --dp dp --micro-batch mb` predicts the same step.
# Layouts (dp, micro-batch) of tiny and gpt2-124m; the worker's tensor/pipeline degrees are not wired into its trainer
# yet, so every layout here has tp = pp = 1. Prints one JSON line per layout and a summary; exits 1 when a ratio is
# outside [1/FACTOR, FACTOR]. Whether the layout the planner ranks first is among the two fastest measured is printed
# but not enforced: rank 0's CPU time does not count the time it sleeps in Gloo, so the CPU clock favours dp = 2,
# and wall time on the shared 2-core machine measures the other load (see docs/planner.md).
# Usage: tests/bench/planner/cpu_step.sh [BIN_DIR]   (env: STEPS=4 THREADS=2 FACTOR=1.5)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../../.." && pwd)
bin=${1:-${RAILYARD_BIN_DIR:-$src/build/bin}}
STEPS=${STEPS:-4}
THREADS=${THREADS:-2}
FACTOR=${FACTOR:-1.5}
for f in "$bin/railyard-worker" "$bin/railyard"; do
  [ -x "$f" ] || { echo "cpu_step.sh: $f missing: build the railyard-worker and railyard targets" >&2; exit 1; }
done
(( THREADS >= 2 && THREADS % 2 == 0 )) || { echo "cpu_step.sh: THREADS must be even and >= 2" >&2; exit 1; }
work=$(mktemp -d /tmp/railyard-plan-bench-XXXXXX)
trap 'rm -rf "$work"' EXIT
"$bin/railyard" data prepare --input /usr/share/common-licenses/* --output "$work/data" >/dev/null
half=$((THREADS / 2))
"$bin/railyard" plan --calibrate --threads "$THREADS" --output "$work/cpu-$THREADS.yaml"
"$bin/railyard" plan --calibrate --threads "$half" --output "$work/cpu-$half.yaml"
# Processes of one machine: one "node" holding dp processes, so the dp ring runs on the loopback path.
for dp in 1 2; do printf 'gpusPerNode: %d\nnodesPerUnit: 1\nunits: 1\n' "$dp" > "$work/topo-$dp.yaml"; done

results="$work/results.jsonl"
# model  L  C  NH  V(real)  T  global-sequences  dp  micro-batch
while read -r model L C NH V T G dp mb; do
  threads=$((THREADS / dp))
  tag="$model-dp$dp-mb$mb"
  launch=()
  (( dp > 1 )) && launch=(--nproc "$dp")
  "$bin/railyard-worker" train --model "$model" --data "$work/data" --steps "$STEPS" --batch "$mb" --seq "$T" \
    --global-batch $((G * T)) --threads "$threads" "${launch[@]}" --log-json "$work/$tag.jsonl" > "$work/$tag.log" 2>&1 \
    || { echo "cpu_step.sh: railyard-worker failed for $tag:" >&2; tail -5 "$work/$tag.log" >&2; exit 1; }
  "$bin/railyard" plan --layers "$L" --hidden "$C" --heads "$NH" --seq "$T" --vocab "$V" --global-batch "$G" \
    --gpus "$dp" --dp "$dp" --gpu "$work/cpu-$threads.yaml" --topology "$work/topo-$dp.yaml" --micro-batch "$mb" \
    --zero 0 --recompute none --top 1 --json > "$work/$tag.plan.json"
  /usr/bin/python3 - "$work/$tag.jsonl" "$work/$tag.plan.json" "$model" "$dp" "$mb" "$G" "$T" "$threads" \
    >> "$results" <<'PY'
import json, statistics, sys
steps_path, plan_path, model, dp, mb, G, T, threads = sys.argv[1:]
steps = [json.loads(l) for l in open(steps_path) if '"event":"step"' in l.replace(" ", "")]
# Per-thread CPU time per step (rank 0): the step's time on an otherwise idle machine, the same clock the calibration
# used. Wall time is reported too; on the shared machine it mostly measures the other load.
measured = statistics.median([s["cpu_ms"] / 1e3 / int(threads) for s in steps[1:]])
wall = statistics.median([s["step_ms"] / 1e3 for s in steps[1:]])
plan = json.load(open(plan_path))["plans"][0]
print(json.dumps({"model": model, "dp": int(dp), "micro_batch": int(mb), "global_batch": int(G), "T": int(T),
                  "measured_step_s": round(measured, 4), "measured_wall_s": round(wall, 4),
                  "predicted_step_s": round(plan["stepSeconds"], 4),
                  "predicted_over_measured": round(plan["stepSeconds"] / measured, 3), "time": plan["time"]}))
PY
  tail -1 "$results"
done <<'LAYOUTS'
tiny 4 128 4 256 128 16 1 16
tiny 4 128 4 256 128 16 1 4
tiny 4 128 4 256 128 16 2 8
tiny 4 128 4 256 128 16 2 2
gpt2-124m 12 768 12 50257 64 4 1 4
gpt2-124m 12 768 12 50257 64 4 2 2
LAYOUTS

/usr/bin/python3 - "$results" "$FACTOR" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
factor = float(sys.argv[2])
ok = True
within = [r for r in rows if 1 / factor <= r["predicted_over_measured"] <= factor]
print(f"{len(within)} of {len(rows)} layouts predicted within x{factor} of the measured step "
      f"(ratios {[r['predicted_over_measured'] for r in rows]})")
ok &= len(within) == len(rows)
for model in sorted({r["model"] for r in rows}):
    mine = [r for r in rows if r["model"] == model]
    best = min(mine, key=lambda r: r["predicted_step_s"])
    fastest = sorted(mine, key=lambda r: r["measured_step_s"])[:2]
    hit = best in fastest
    print(f"{model}: planner's first dp{best['dp']} mb{best['micro_batch']}; two fastest measured: "
          f"{[(r['dp'], r['micro_batch']) for r in fastest]} -> {'ok' if hit else 'MISS'}")
sys.exit(0 if ok else 1)
PY
