#!/usr/bin/env bash
# Benchmark (issue #10): elastic recovery per flow with the real trainer on the local cluster. For each flow, one run
# of tests/e2e/elastic/chaos_test.sh with only that fault kind, a fault every PERIOD seconds (RAILYARD_BENCH_PERIOD,
# default 20) through a job of STEPS steps (RAILYARD_BENCH_STEPS, default 600), plus an undisturbed run of the same job
# side by side. Per flow: failure -> detection (the agents hear of the new generation), failure -> first completed step
# of the new generation, steps lost, and goodput = steps x median undisturbed step time / wall time (first step to
# Succeeded). The resize flow is a node loss with the job confined to unit u0 (minReplicas 1): shrink, and a grow at
# node-up. Prints a Markdown table for docs/benchmarks.md and leaves the JSON per flow in OUT (default
# build/bench/elastic; RAILYARD_BENCH_FLOWS picks flows, RAILYARD_BENCH_SUMMARY_ONLY=1 prints the table of earlier
# runs). No reference run (timing only; the e2e tests check the parameters).
#   tests/bench/elastic/recovery.sh STATE_DIR BUILD_DIR
set -euo pipefail
state=${1:?usage: recovery.sh STATE_DIR BUILD_DIR}
build=${2:?usage: recovery.sh STATE_DIR BUILD_DIR}
src=$(cd "$(dirname "$0")/../../.." && pwd)
out=${RAILYARD_BENCH_OUT:-$build/bench/elastic}
period=${RAILYARD_BENCH_PERIOD:-20}
steps=${RAILYARD_BENCH_STEPS:-600}
flows=${RAILYARD_BENCH_FLOWS:-baseline kill hang pod node resize}
mkdir -p "$out"
for flow in $flows; do
  [ -z "${RAILYARD_BENCH_SUMMARY_ONLY:-}" ] || break # the table of runs already in OUT
  kinds=$flow confine=""
  case "$flow" in
    baseline) kinds="" ;;
    resize) kinds=node confine=u0 ;;
  esac
  echo "== $flow (a fault every ${period} s, $steps steps)" >&2
  RAILYARD_E2E_STATE_DIR=$state RAILYARD_SOURCE_DIR=$src RAILYARD_BIN_DIR=$build/bin RAILYARD_CHAOS_KINDS=$kinds \
    RAILYARD_CHAOS_CONFINE=$confine RAILYARD_CHAOS_STEPS=$steps RAILYARD_CHAOS_GAP_SECONDS=$period \
    RAILYARD_CHAOS_SECONDS=100000 RAILYARD_CHAOS_SEED=${RAILYARD_BENCH_SEED:-7} RAILYARD_CHAOS_NO_REFERENCE=1 \
    RAILYARD_CHAOS_RESULT=$out/$flow.json bash "$src/tests/e2e/elastic/chaos_test.sh" >"$out/$flow.log" 2>&1 ||
    { tail -n 30 "$out/$flow.log" >&2; echo "recovery bench: the $flow run failed (log: $out/$flow.log)" >&2; exit 1; }
  grep -E '^  |^chaos: [0-9]+ faults' "$out/$flow.log" >&2 || true
done
python3 - "$out" $flows <<'PY'
import json, os, statistics, sys
out, flows = sys.argv[1], sys.argv[2:]
def med(v):
    v = [x for x in v if x is not None]
    return f"{statistics.median(v):.2f}" if v else "n/a"
def rng(v):
    v = [x for x in v if x is not None]
    return f"{min(v):.2f}-{max(v):.2f}" if v else "n/a"
base = json.load(open(os.path.join(out, "baseline.json"))) if "baseline" in flows else None
print(f"machine: {os.uname().nodename}, {os.cpu_count()} cores; date {json.load(open(os.path.join(out, flows[0] + '.json')))['date']}")
print()
print("| flow | faults | failure -> detected (median, range) | failure -> first step of the new generation (median, range) | steps lost (max, total) | median step | wall (first step -> Succeeded) | goodput |")
print("|---|---|---|---|---|---|---|---|")
for f in flows:
    r = json.load(open(os.path.join(out, f + ".json")))
    ev = r["events"]
    det = [e.get("detect_s") for e in ev]
    rec = [e.get("recovery_s") for e in ev]
    lost = [e.get("steps_lost", 0) for e in ev]
    extra = ""
    if f == "resize":
        g = [e.get("grow_recovery_s") for e in ev]
        gl = [e.get("grow_steps_lost", 0) for e in ev]
        extra = f"; grow: node-up -> first step {med(g)} s ({rng(g)}), steps lost max {max(gl, default=0)}"
    print(f"| {f} | {len(ev)} | {med(det)} s ({rng(det)}) | {med(rec)} s ({rng(rec)}){extra} | "
          f"{max(lost, default=0)}, {sum(lost)} | {r['step_s_median']} s | {r['wall_s']} s | {r['goodput']} |")
PY
