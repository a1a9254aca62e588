#!/usr/bin/env bash
# Soak (issue #13): for RAILYARD_SOAK_SECONDS (default 45; hours are fine) railyard-operator runs rounds of small
# shell-command jobs: one succeeds, one fails with a permanent exit code, one fails once (137) and then succeeds, one
# runs, is scaled 1 -> 2 and is deleted while running. Every job must reach its correct state (phase, exact
# restarts and generation) and every deleted job must leave no pod behind. The operator's RSS and open file
# descriptors are sampled every 2 s; after the first (warm-up) round they must stay flat:
#   fds: the maximum of the last third of the samples <= the maximum of the first third + 4. Each API call is a
#     short-lived connection and watches reconnect, so a couple of sockets come and go; a leak of one fd per job
#     grows by 4 per round and exceeds this within two rounds.
#   RSS: the maximum of the last third <= the maximum of the first third x 1.2 + 4 MiB. glibc keeps freed memory
#     in per-thread arenas, so RSS moves by a few MiB without a leak; a leak of 100 KiB per job (a lost pod or
#     status object per job) exceeds this within a few minutes, a smaller leak only in an hours-long run.
# Writes $RAILYARD_RESULTS_DIR/soak.json when that variable is set.
set -euo pipefail
duration=${RAILYARD_SOAK_SECONDS:-45}
[[ "$duration" =~ ^[1-9][0-9]*$ ]] || { echo "RAILYARD_SOAK_SECONDS='$duration': give a whole number of seconds" >&2; exit 2; }
# shellcheck source=../e2e/lib/cluster_env.sh
source "${RAILYARD_SOURCE_DIR:?}/tests/e2e/lib/cluster_env.sh" soak-e2e
pids=()
t_start=$SECONDS
fail() {
  echo "FAIL: $*" >&2
  dump_jobs
  echo "--- samples (t rss_kib fds):" >&2
  cat "$work/samples.txt" >&2 || true
  tail -n 40 "$work/op.log" >&2
  exit 1
}
trap chaos_cleanup EXIT
# shellcheck source=lib.sh
source "$src/tests/chaos/lib.sh"
running_at() { [ "$(jp "$1" '{.status.phase}/{.status.world.size}')" = "Running/$2" ]; }
no_pods() { [ -z "$(kubectl get pods -n "$ns" -l "railyard.dev/job=$1" -o name 2>/dev/null)" ]; }

submit() { shell_job "$@" | kubectl apply -n "$ns" -f - >/dev/null; }
expect() { # expect JOB PHASE RESTARTS GENERATION
  local got
  got=$(jp "$1" '{.status.phase} {.status.restarts} {.status.generation}')
  [ "$got" = "$2 $3 $4" ] || fail "$1: phase/restarts/generation '$got', want '$2 $3 $4'"
}

setup_namespace
start_operator_direct

sample() { # prints: seconds-since-start rss-KiB open-fds
  local rss fds
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$op_pid/status")
  fds=$(find "/proc/$op_pid/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
  echo "$((SECONDS - t_start)) $rss $fds"
}

jobs_run=0
jobs_correct=0
round() { # round N: the four kinds of job; returns once all four are done and deleted
  local n=$1 marker=$work/flaky-$1
  submit "ok-$n" 1 1 "sleep 1; exit 0"
  submit "perm-$n" 1 2 "exit 3"
  submit "flaky-$n" 1 2 "if [ -e $marker ]; then exit 0; fi; touch $marker; exit 137"
  submit "scale-$n" 1 2 "sleep 600"
  jobs_run=$((jobs_run + 4))
  wait_for 60 "ok-$n to succeed" phase_is "ok-$n" Succeeded
  wait_for 60 "perm-$n to fail" phase_is "perm-$n" Failed
  wait_for 60 "flaky-$n to succeed" phase_is "flaky-$n" Succeeded
  wait_for 60 "scale-$n to run" running_at "scale-$n" 1
  expect "ok-$n" Succeeded 0 1
  expect "perm-$n" Failed 0 1
  expect "flaky-$n" Succeeded 1 2
  kubectl delete tj "ok-$n" "perm-$n" "flaky-$n" -n "$ns" --wait=false >/dev/null
  kubectl scale tj "scale-$n" -n "$ns" --replicas=2 >/dev/null
  wait_for 60 "scale-$n to run at 2 pods" running_at "scale-$n" 2
  expect "scale-$n" Running 0 2
  kubectl delete tj "scale-$n" -n "$ns" --wait=false >/dev/null
  for j in "ok-$n" "perm-$n" "flaky-$n" "scale-$n"; do wait_for 60 "the pods of $j to go" no_pods "$j"; done
  jobs_correct=$((jobs_correct + 4))
}

echo "operator up after $((SECONDS - t_start))s"
round 0 # warm-up: the first jobs allocate the operator's caches and thread arenas
echo "warm-up round done after $((SECONDS - t_start))s; soaking for ${duration}s"
n=1
sample >"$work/samples.txt"
t_soak=$SECONDS
while [ $((SECONDS - t_soak)) -lt "$duration" ]; do
  (while :; do sample; sleep 2; done) >>"$work/samples.txt" &
  sampler=$!
  round "$n"
  kill "$sampler"
  wait "$sampler" 2>/dev/null || true
  n=$((n + 1))
done
sample >>"$work/samples.txt"
soak_s=$((SECONDS - t_soak))
kill -0 "$op_pid" 2>/dev/null || fail "the operator exited"
[ "$(kubectl get tj -n "$ns" -o name | wc -l)" = 0 ] || fail "TrainingJobs left over"

verdict=$(python3 - "$work/samples.txt" <<'PY'
import sys
rows = [tuple(map(int, l.split())) for l in open(sys.argv[1]) if l.strip()]
k = max(1, len(rows) // 3)
first, last = rows[:k], rows[-k:]
rss0, rss1 = max(r[1] for r in first), max(r[1] for r in last)
fd0, fd1 = max(r[2] for r in first), max(r[2] for r in last)
ok = fd1 <= fd0 + 4 and rss1 <= rss0 * 1.2 + 4096
print(f"{'ok' if ok else 'grew'} {rows[0][1]} {rows[-1][1]} {rss0} {rss1} {rows[0][2]} {rows[-1][2]} {fd0} {fd1} {len(rows)}")
PY
)
read -r status rss_start rss_end rss_first rss_last fd_start fd_end fd_first fd_last nsamples <<<"$verdict"
echo "soak: ${soak_s}s, $((n - 1)) rounds, $jobs_run jobs (incl. warm-up), $nsamples samples;" \
  "RSS ${rss_start} -> ${rss_end} KiB (max first/last third ${rss_first}/${rss_last});" \
  "fds ${fd_start} -> ${fd_end} (max ${fd_first}/${fd_last})"
[ "$status" = ok ] || fail "the operator's RSS or fds grew beyond the tolerance (see the header of $0)"

if [ -n "${RAILYARD_RESULTS_DIR:-}" ]; then
  mkdir -p "$RAILYARD_RESULTS_DIR"
  cat >"$RAILYARD_RESULTS_DIR/soak.json" <<JSON
{"test": "e2e_soak", "date": "$(date -u +%FT%TZ)", "seconds": $((SECONDS - t_start)), "passed": true,
 "soak_seconds": $soak_s, "rounds": $((n - 1)), "jobs_run": $jobs_run, "jobs_correct": $jobs_correct,
 "rss_start_kib": $rss_start, "rss_end_kib": $rss_end, "fds_start": $fd_start, "fds_end": $fd_end, "samples": $nsamples}
JSON
fi
echo "soak e2e: ok in $((SECONDS - t_start))s"
