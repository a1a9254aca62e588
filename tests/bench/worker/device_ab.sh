#!/usr/bin/env bash
# A/B of two railyard-worker binaries on the CPU, side by side in one run: e.g. main's against a branch's, to show that
# a change (the device interface, docs/gpu.md) costs the CPU trainer nothing. Alternates the binaries ROUNDS times,
# each run training STEPS steps of MODEL; per run the first step is dropped (page faults of the optimizer state), and
# the report is the median over all kept steps of tokens/s and of process CPU ms per step, per binary, and B/A.
#   tests/bench/worker/device_ab.sh A/railyard-worker B/railyard-worker [railyard-cli-for-data-prepare]
# env: MODEL (gpt2-124m), B (4), T (64), STEPS (4), ROUNDS (3), THREADS (2)
set -euo pipefail
# shellcheck source=ab_lib.sh
source "$(dirname "$0")/ab_lib.sh" "$@"
CLI=${3:-$(dirname "$Bbin")/railyard}
MODEL=${MODEL:-gpt2-124m} BATCH=${B:-4} SEQ=${T:-64} STEPS=${STEPS:-4} ROUNDS=${ROUNDS:-3} THREADS=${THREADS:-2}
"$CLI" data prepare --input /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 \
  --output "$work/data" >/dev/null 2>&1
train_run() { # BIN SIDE ROUND
  "$1" train --model "$MODEL" --data "$work/data" --steps "$STEPS" --batch "$BATCH" --seq "$SEQ" \
    --threads "$THREADS" --peak-flops 1e11 --log-json "$work/$2.$3.jsonl" 2>"$work/$2.$3.log"
}
alternate_ab "$ROUNDS" train_run
/usr/bin/python3 - "$work" "$ROUNDS" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
res = {}
for side in "AB":
    tps, cpu = [], []
    for r in range(1, rounds + 1):
        steps = [json.loads(l) for l in open(f"{work}/{side}.{r}.jsonl") if '"step"' in l]
        steps = [s for s in steps if s.get("event") == "step"][1:]
        tps += [s["tokens_per_s"] for s in steps]
        cpu += [s["cpu_ms"] for s in steps]
    res[side] = (statistics.median(tps), statistics.median(cpu), len(tps))
    print(f"{side}: median tokens/s {res[side][0]:.1f}  median cpu ms/step {res[side][1]:.0f}  ({res[side][2]} steps)")
print(f"B/A tokens/s {res['B'][0] / res['A'][0]:.3f}   B/A cpu ms/step {res['B'][1] / res['A'][1]:.3f}")
PY
