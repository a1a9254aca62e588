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
# shellcheck source=../bin_lib.sh
source "$(dirname "$0")/../bin_lib.sh" "$@"
STEPS=${STEPS:-4}
THREADS=${THREADS:-2}
FACTOR=${FACTOR:-1.5}
(( THREADS >= 2 && THREADS % 2 == 0 )) || { echo "cpu_step.sh: THREADS must be even and >= 2" >&2; exit 1; }
work=$(mktemp -d /tmp/railyard-plan-bench-XXXXXX)
trap 'rm -rf "$work"' EXIT
"$bin/railyard" data prepare --input /usr/share/common-licenses/* --output "$work/data" >/dev/null
half=$((THREADS / 2))
"$bin/railyard" plan --calibrate --threads "$THREADS" --output "$work/cpu-$THREADS.yaml"
# The per-process profile of a 2-process world is measured by two calibrations running at once: the two ranks of
# `train --nproc 2` share the machine's memory bandwidth and caches, and a calibration alone would not see that.
"$bin/railyard" plan --calibrate --threads "$half" --output "$work/cpu-$half.yaml" &
"$bin/railyard" plan --calibrate --threads "$half" --output "$work/cpu-$half-twin.yaml"
wait $!
# Processes of one machine: one "node" holding dp processes, so the dp ring runs on the loopback path.
for n in 1 2; do printf 'gpusPerNode: %d\nnodesPerUnit: 1\nunits: 1\n' "$n" > "$work/topo-$n.yaml"; done

results="$work/results.jsonl"
# model  L  C  NH  V(real)  T  global-sequences  dp  tp  pp  micro-batch
while read -r model L C NH V T G dp tp pp mb; do
  world=$((dp * tp * pp))
  threads=$((THREADS / world))
  tag="$model-dp$dp-tp$tp-pp$pp-mb$mb"
  launch=()
  (( world > 1 )) && launch=(--nproc "$world" --tp "$tp" --pp "$pp")
  "$bin/railyard-worker" train --model "$model" --data "$work/data" --steps "$STEPS" --batch "$mb" --seq "$T" \
    --global-batch $((G * T)) --threads "$threads" "${launch[@]}" --log-json "$work/$tag.jsonl" > "$work/$tag.log" 2>&1 \
    || { echo "cpu_step.sh: railyard-worker failed for $tag:" >&2; tail -5 "$work/$tag.log" >&2; exit 1; }
  "$bin/railyard" plan --layers "$L" --hidden "$C" --heads "$NH" --seq "$T" --vocab "$V" --global-batch "$G" \
    --gpus "$world" --dp "$dp" --tp "$tp" --pp "$pp" --gpu "$work/cpu-$threads.yaml" --topology "$work/topo-$world.yaml" \
    --micro-batch "$mb" --zero 0 --recompute none --sp off --interleave 1 --top 1 --json > "$work/$tag.plan.json"
  /usr/bin/python3 - "$work/$tag.jsonl" "$work/$tag.plan.json" "$model" "$dp" "$tp" "$pp" "$mb" "$G" "$T" "$threads" \
    >> "$results" <<'PY'
import json, statistics, sys
steps_path, plan_path, model, dp, tp, pp, mb, G, T, threads = sys.argv[1:]
steps = [json.loads(l) for l in open(steps_path) if '"event":"step"' in l.replace(" ", "")]
# Rank 0's CPU time per thread and step: the step's time on an otherwise idle machine, the clock the calibration used.
# CPU time does not count the time a pipeline stage is blocked on its neighbours (the bubble), so it is divided by
# the fraction of the step's wall time rank 0 was not waiting in pipeline send/recv (pp_wait; 0 without pp): under
# a load that slows every rank alike, that fraction is what it would be on an idle machine.
def idle_step(s):
    busy = 1 - s["pp_wait_ms"] / s["step_ms"]
    return s["cpu_ms"] / 1e3 / int(threads) / max(busy, 0.05)
measured = statistics.median([idle_step(s) for s in steps[1:]])
cpu = statistics.median([s["cpu_ms"] / 1e3 / int(threads) for s in steps[1:]])
wall = statistics.median([s["step_ms"] / 1e3 for s in steps[1:]])
wait = statistics.median([s["pp_wait_ms"] / s["step_ms"] for s in steps[1:]])
plan = json.load(open(plan_path))["plans"][0]
print(json.dumps({"model": model, "dp": int(dp), "tp": int(tp), "pp": int(pp), "micro_batch": int(mb),
                  "global_batch": int(G), "T": int(T), "measured_step_s": round(measured, 4),
                  "measured_cpu_s": round(cpu, 4), "pp_wait_fraction": round(wait, 3), "measured_wall_s": round(wall, 4),
                  "predicted_step_s": round(plan["stepSeconds"], 4),
                  "predicted_over_measured": round(plan["stepSeconds"] / measured, 3), "time": plan["time"]}))
PY
  tail -1 "$results"
done <<'LAYOUTS'
tiny 4 128 4 256 128 16 1 1 1 16
tiny 4 128 4 256 128 16 1 1 1 4
tiny 4 128 4 256 128 16 2 1 1 8
tiny 4 128 4 256 128 16 2 1 1 2
tiny 4 128 4 256 128 16 1 2 1 8
tiny 4 128 4 256 128 16 1 1 2 4
gpt2-124m 12 768 12 50257 64 4 1 1 1 4
gpt2-124m 12 768 12 50257 64 4 2 1 1 2
gpt2-124m 12 768 12 50257 64 4 1 2 1 4
gpt2-124m 12 768 12 50257 64 4 1 1 2 1
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
    name = lambda r: f"dp{r['dp']} tp{r['tp']} pp{r['pp']} mb{r['micro_batch']}"
    print(f"{model}: planner's first {name(best)}; two fastest measured: {[name(r) for r in fastest]} -> "
          f"{'ok' if hit else 'MISS'}")
sys.exit(0 if ok else 1)
PY
