#!/usr/bin/env bash
# Start-up cost of two railyard-worker binaries side by side (docs/gpu.md "Lazy loading"): wall time and peak RSS of
# the same command, alternating A and B ROUNDS times, reported as medians and B/A. The default command is a CPU run
# that stops right after flag parsing and the device choice (no --data: exit 2), which is the fixed cost every run
# pays before training; with DATA=dir it trains STEPS steps of a tiny model on the CPU instead.
#   tests/bench/worker/startup_ab.sh A/railyard-worker B/railyard-worker
# env: ROUNDS (7), DEVICE (cpu), DATA (unset), STEPS (2)
set -euo pipefail
# shellcheck source=ab_lib.sh
source "$(dirname "$0")/ab_lib.sh" "$@"
ROUNDS=${ROUNDS:-7} DEVICE=${DEVICE:-cpu} STEPS=${STEPS:-2}
args=(train --device "$DEVICE")
if [[ -n ${DATA:-} ]]; then
  args+=(--model l=1,c=32,nh=2,t=32,v=256 --data "$DATA" --steps "$STEPS" --batch 2 --seq 16 --threads 1
         --peak-flops 1e11)
fi
timed_run() { # BIN SIDE ROUND
  /usr/bin/time -f "%e %M" -o "$work/$2.$3" "$1" "${args[@]}" >/dev/null 2>&1 || true
}
alternate_ab "$ROUNDS" timed_run
/usr/bin/python3 - "$work" "$ROUNDS" <<'PY'
import statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
res = {}
for side in "AB":
    wall, rss = [], []
    for r in range(1, rounds + 1):
        w, m = open(f"{work}/{side}.{r}").read().split()[-2:]
        wall.append(float(w)); rss.append(int(m) / 1024)
    res[side] = (statistics.median(wall), statistics.median(rss), min(wall), max(wall))
    print(f"{side}: median wall {res[side][0]:.3f} s (min {res[side][2]:.2f}, max {res[side][3]:.2f}), "
          f"median peak RSS {res[side][1]:.1f} MB over {rounds} runs")
print(f"B/A: wall {res['B'][0] / res['A'][0]:.3f}, RSS {res['B'][1] / res['A'][1]:.3f}")
PY
