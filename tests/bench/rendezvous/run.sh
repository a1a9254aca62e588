#!/usr/bin/env bash
# The rendezvous service with large worlds (issue 44 item 4; docs/benchmarks.md "Rendezvous at 10,000 agents").
# Alternating rounds: 1,000 agents against the former fixed pool of 64 request threads (--max-threads 64) and the
# growing pool; 1,000 agents over TLS; 10,000 agents (replies read, not parsed: see bench_rendezvous.cc), with the
# pool's cap above and at its default. Run alone on a quiet machine: it prints the load before and after.
#   tests/bench/rendezvous/run.sh BUILD_DIR [ROUNDS]
set -euo pipefail
build=${1:?usage: run.sh BUILD_DIR [ROUNDS]}
rounds=${2:-3}
bench="$build/bin/bench_rendezvous"
[[ -x $bench ]] || { echo "run.sh: $bench not built (cmake --build $build --target bench_rendezvous)" >&2; exit 2; }
echo "date: $(date -u +%FT%TZ)  host: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p')"
echo "cpu flags of note: $(grep -m1 -o -w -E 'avx2|avx512f|avx512_bf16|amx_tile|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
run() { "$bench" "$@" 2>&1 | grep -E '^(round|rendezvous bench|after last join|agent failed|silence rule)' | sed 's/^/  /'; }
for r in $(seq 1 "$rounds"); do
  echo "== round $r: 1,000 agents, fixed pool of 64 (the former service)"
  run --agents 1000 --max-threads 64
  echo "== round $r: 1,000 agents, growing pool (default cap 2048)"
  run --agents 1000
done
for r in $(seq 1 "$rounds"); do
  echo "== round $r: 1,000 agents over TLS, growing pool"
  run --agents 1000 --tls on
  echo "== round $r: 10,000 agents, growing pool capped at 12,000, replies read not parsed"
  run --agents 10000 --max-threads 12000 --parse off
done
echo "== 10,000 agents at a cap of 4096, replies read not parsed"
run --agents 10000 --max-threads 4096 --parse off
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
