#!/usr/bin/env bash
# Benchmark: railyard-worker vs PyTorch CPU, GPT-2 124M (or MODEL), B=4, T=64, AdamW, same thread count, in
# ROUNDS alternating rounds (ours then PyTorch, then PyTorch then ours, ...), so that a change of the machine's
# speed during the run hits both sides alike. Also: the fraction of the machine's GEMM rate (measured by
# railyard-worker on the step's own GEMM shapes, around every round) that a step reaches, and peak RSS against the
# declared memory budget. The load average is printed before, between rounds and after: record only quiet runs.
# Usage: tests/bench/worker/train_vs_torch.sh [BIN_DIR]
#   (env: ROUNDS=3 STEPS=6 THREADS=2 MODEL=gpt2-124m B=4 T=64)
# Prints one line per round, the median and spread (min-max) over rounds of every ratio, and a JSON line; exits 1 if
# a run fails. Results go to docs/benchmarks.md by hand.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../bin_lib.sh
source "$(dirname "$0")/../bin_lib.sh" "$@"
STEPS=${STEPS:-6}
ROUNDS=${ROUNDS:-3}
MODEL=${MODEL:-gpt2-124m}
THREADS=${THREADS:-2}
B=${B:-4}
T=${T:-64}
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "train_vs_torch.sh: /usr/bin/python3 has no torch: scripts/install-deps.sh --with-torch" >&2; exit 1; }
blas=$(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | awk '/^Value:/ {print $2}')
case "$blas" in
  *openblas*) ;;
  *) echo "train_vs_torch.sh: libblas.so.3 points to '$blas', not OpenBLAS: PyTorch would run ~15x slower than it can (install libopenblas0-pthread)" >&2; exit 1 ;;
esac

work=$(mktemp -d /tmp/railyard-bench-XXXXXX)
trap 'rm -rf "$work"' EXIT
"$bin/railyard" data prepare --input /usr/share/common-licenses/* --output "$work/data" >/dev/null

load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "== load average before: $(load)" >&2
echo "== $ROUNDS rounds: railyard-worker and PyTorch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)')," \
  "$MODEL, B=$B, T=$T, threads=$THREADS, $STEPS steps each" >&2

# The GEMM rate of the step's shapes with training's split (the best measurement is the floor MFU is taken against;
# one spike of other load can halve a single one).
measure_gemm() { # round
  "$bin/railyard-worker" gemm-rate --model "$MODEL" --batch "$B" --seq "$T" --threads "$THREADS" >>"$work/gemm$1.jsonl"
}
run_ours() { # round
  /usr/bin/time -v -o "$work/time$1.txt" "$bin/railyard-worker" train --model "$MODEL" --data "$work/data" \
    --steps "$STEPS" --batch "$B" --seq "$T" --threads "$THREADS" --log-json "$work/ours$1.jsonl" 2>"$work/ours$1.log"
}
case "$MODEL" in # train_torch.py takes the shape
  gpt2-124m) shape=(--layers 12 --channels 768 --heads 12) ;;
  gpt2-350m) shape=(--layers 24 --channels 1024 --heads 16) ;;
  *) echo "train_vs_torch.sh: MODEL '$MODEL': use gpt2-124m or gpt2-350m" >&2; exit 2 ;;
esac
run_torch() { # round
  /usr/bin/python3 "$here/train_torch.py" "${shape[@]}" --batch "$B" --seq "$T" --steps "$STEPS" \
    --threads "$THREADS" >"$work/torch$1.json"
}
for r in $(seq 1 "$ROUNDS"); do
  measure_gemm "$r"
  if [ $((r % 2)) = 1 ]; then run_ours "$r"; run_torch "$r"; else run_torch "$r"; run_ours "$r"; fi
  measure_gemm "$r"
  echo "== round $r done, load average $(load)" >&2
done
echo "== load average after: $(load)" >&2

/usr/bin/python3 - "$work" "$ROUNDS" "$B" "$T" <<'PY'
import glob, json, re, statistics, sys
work, rounds, B, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
tokens = B * T
med = statistics.median
rows = []
for r in range(1, rounds + 1):
    steps = [json.loads(l) for l in open(f"{work}/ours{r}.jsonl") if '"event":"step"' in l.replace(" ", "")]
    tor = json.load(open(f"{work}/torch{r}.json"))
    gemm = [json.loads(l) for l in open(f"{work}/gemm{r}.jsonl")]
    log = open(f"{work}/ours{r}.log").read()
    budget = int(re.search(r"memory budget.* total_bytes=(\d+)", log).group(1))
    in_run = float(re.search(r" peak_flops=([0-9.e+]+) ", log).group(1))
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(f"{work}/time{r}.txt").read()).group(1))
    rate = max([in_run] + [g["gemm_flops_per_s"] for g in gemm])
    cpu_rate = max(g["gemm_flops_per_cpu_s"] for g in gemm)
    # The first step warms caches and page-faults the optimizer state on both sides: dropped.
    ow = [s["step_ms"] / 1e3 for s in steps[1:]]
    oc = [s["cpu_ms"] / 1e3 for s in steps[1:]]
    tw, tc = tor["step_seconds"][1:], tor["cpu_seconds"][1:]
    fpt = steps[1]["flops_per_s"] * steps[1]["step_ms"] / 1e3 / tokens  # FLOPs per token as the worker counts them
    rows.append({
        "round": r, "ours_step_s_median": round(med(ow), 3), "torch_step_s_median": round(med(tw), 3),
        "ours_tokens_per_s": round(tokens / med(ow), 1), "torch_tokens_per_s": round(tokens / med(tw), 1),
        "speedup_median": round(med(tw) / med(ow), 3), "speedup_worst_step": round(min(tw) / max(ow), 3),
        "speedup_cpu_time": round(med(tc) / med(oc), 3), "gemm_rate_flops": rate,
        "fraction_of_gemm_rate": round(fpt * tokens / med(ow) / rate, 3),
        # per CPU-second on both sides: pool threads block instead of spinning, so a descheduled peer costs none
        "fraction_of_gemm_rate_cpu_time": round(fpt * tokens / med(oc) / cpu_rate, 3),
        "rss_over_budget": round(rss_kb * 1024 / budget, 3),
    })
for row in rows:
    print("round {round}: ours {ours_step_s_median} s/step ({ours_tokens_per_s} tok/s), PyTorch {torch_step_s_median} "
          "s/step ({torch_tokens_per_s} tok/s): speedup {speedup_median} (worst step pair {speedup_worst_step}, CPU "
          "time {speedup_cpu_time}); GEMM rate {gemm_rate_flops:.4g}, fraction {fraction_of_gemm_rate} (CPU time "
          "{fraction_of_gemm_rate_cpu_time}); RSS/budget {rss_over_budget}".format(**row), file=sys.stderr)
summary = {}
for k in ["speedup_median", "speedup_worst_step", "speedup_cpu_time", "fraction_of_gemm_rate",
          "fraction_of_gemm_rate_cpu_time", "ours_step_s_median", "torch_step_s_median", "rss_over_budget"]:
    v = [row[k] for row in rows]
    summary[k] = {"median": round(med(v), 3), "min": min(v), "max": max(v)}
    print(f"{k:32s} median {summary[k]['median']}  spread {min(v)} - {max(v)}", file=sys.stderr)
print(json.dumps({"rounds": rows, "summary": summary}))
PY
