#!/usr/bin/env bash
# Benchmark: the planner's predicted single-process CPU step time against what railyard-worker measures, in one run.
# 1. `railyard plan --calibrate` measures this machine's kernels into a CPU profile (a temp file);
# 2. `railyard-worker train` runs STEPS steps of each model (first step dropped, median of the rest);
# 3. `railyard plan --gpu <that profile> --gpus 1` predicts the same step (dp1 tp1 pp1, one micro-batch, no ZeRO).
# Prints one JSON line per model with predicted/measured; exits 1 when a ratio is outside [1/FACTOR, FACTOR].
# Usage: tests/bench/planner/cpu_step.sh [BIN_DIR]   (env: STEPS=5 THREADS=2 FACTOR=1.5)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../../.." && pwd)
bin=${1:-${RAILYARD_BIN_DIR:-$src/build/bin}}
STEPS=${STEPS:-5}
THREADS=${THREADS:-2}
FACTOR=${FACTOR:-1.5}
for f in "$bin/railyard-worker" "$bin/railyard"; do
  [ -x "$f" ] || { echo "cpu_step.sh: $f missing: build the railyard-worker and railyard targets" >&2; exit 1; }
done
work=$(mktemp -d /tmp/railyard-plan-bench-XXXXXX)
trap 'rm -rf "$work"' EXIT
"$bin/railyard" data prepare --input /usr/share/common-licenses/* --output "$work/data" >/dev/null
"$bin/railyard" plan --calibrate --threads "$THREADS" --output "$work/cpu.yaml"
status=0
# model  L  C  NH  V(real)  B  T
for spec in "tiny 4 128 4 256 8 256" "gpt2-124m 12 768 12 50257 4 64"; do
  read -r model L C NH V B T <<<"$spec"
  "$bin/railyard-worker" train --model "$model" --data "$work/data" --steps "$STEPS" --batch "$B" --seq "$T" \
    --threads "$THREADS" --log-json "$work/$model.jsonl" 2> "$work/$model.log"
  "$bin/railyard" plan --layers "$L" --hidden "$C" --heads "$NH" --seq "$T" --vocab "$V" --global-batch "$B" \
    --gpus 1 --gpu "$work/cpu.yaml" --micro-batch "$B" --zero 0 --recompute none --top 1 --json > "$work/$model.plan.json"
  /usr/bin/python3 - "$work/$model.jsonl" "$work/$model.plan.json" "$model" "$FACTOR" "$B" "$T" <<'PY' || status=1
import json, statistics, sys
steps_path, plan_path, model, factor, B, T = sys.argv[1:]
steps = [json.loads(l) for l in open(steps_path) if '"event":"step"' in l.replace(" ", "")]
measured = statistics.median([s["step_ms"] / 1e3 for s in steps[1:]])
plan = json.load(open(plan_path))["plans"][0]
predicted = plan["stepSeconds"]
ratio = predicted / measured
print(json.dumps({"model": model, "B": int(B), "T": int(T), "measured_step_s": round(measured, 4),
                  "predicted_step_s": round(predicted, 4), "predicted_over_measured": round(ratio, 3),
                  "factor_allowed": float(factor), "time": plan["time"]}))
sys.exit(0 if 1 / float(factor) <= ratio <= float(factor) else 1)
PY
done
exit $status
