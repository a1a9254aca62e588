#!/usr/bin/env bash
# E2E (issue #13): etcd restarted, then the API server restarted, in the middle of running jobs (two of which end
# while the component is down). railyard-operator
# (shell-command jobs, no agent) must keep every job correct: the phase, the exact status.restarts and generation,
# no pod started more often than its restarts require (counted from the node agent's "pod started" lines, which
# survive the API server's absence), and jobs submitted after each restart must complete. Records how long each
# restart took and how long until a fresh job succeeded afterwards (recovery).
# Writes $RAILYARD_RESULTS_DIR/restarts.json when that variable is set.
set -euo pipefail
src=${RAILYARD_SOURCE_DIR:?}
state=${RAILYARD_E2E_STATE_DIR:?}
bin=${RAILYARD_BIN_DIR:?}
cluster=$src/deploy/local/cluster.sh
eval "$(bash "$cluster" env --state-dir "$state")"
ns=restart-e2e-$$
work=$(mktemp -d /tmp/restart-e2e.XXXXXX)
pids=()
t_start=$SECONDS
agent_log=$state/logs/node-agent.log
agent_log_start=$(wc -l <"$agent_log")
fail() {
  echo "FAIL: $*" >&2
  dump_jobs
  echo "--- operator log (tail)" >&2
  tail -n 40 "$work/op.log" >&2
  exit 1
}
trap chaos_cleanup EXIT
# shellcheck source=lib.sh
source "$src/tests/chaos/lib.sh"
now() { date +%s.%N; }
elapsed() { python3 -c "print(round($(now) - $1, 1))"; }

submit() { shell_job "$@" | kubectl apply -n "$ns" -f - >/dev/null; }
# kubectl itself may hit the restart window: retry the submission.
submit_retry() { for _ in $(seq 1 40); do submit "$@" && return 0; sleep 0.5; done; fail "cannot submit $1"; }

setup_namespace
start_operator_direct

# end-in-etcd exits 0 about 1 s into the etcd restart (which takes about 2 s) and end-in-api exits 137 (retryable)
# 2 s into the API-server restart (about 15 s): the pods' final status must still reach the API server (a node agent
# that gave up on a failed status update once left such a pod Running forever), and end-in-api must be restarted
# exactly once and then succeed.
marker=$work/end-in-api-failed-once
submit long 2 2 "sleep 600" # Running across both restarts
submit end-in-etcd 1 2 "while [ ! -e $work/etcd-restarting ]; do sleep 0.2; done; sleep 1; exit 0"
wait_api="while [ ! -e $work/api-restarting ]; do sleep 0.2; done"
submit end-in-api 1 2 "if [ -e $marker ]; then exit 0; fi; $wait_api; sleep 2; touch $marker; exit 137"
wait_for 60 "job long to run" phase_is long Running
wait_for 60 "job end-in-etcd to run" phase_is end-in-etcd Running
wait_for 60 "job end-in-api to run" phase_is end-in-api Running

# Jobs not yet finished when a restart begins: those it can affect.
unfinished() { kubectl get tj -n "$ns" -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' |
  grep -cv '^Succeeded$\|^Failed$' || true; }

# timed_restart KEY COMMAND LABEL: counts the unfinished jobs (affected), touches $work/KEY-restarting (the jobs
# waiting for it end now), times `cluster.sh COMMAND` (restart_s), then how long a new job after-KEY takes to succeed
# (recovery_s).
timed_restart() {
  local key=$1 command=$2 label=$3 t0 t_back
  affected=$(unfinished)
  t0=$(now)
  touch "$work/$key-restarting"
  bash "$cluster" "$command" --state-dir "$state" 2>>"$work/cluster.log" || fail "$command failed"
  restart_s=$(elapsed "$t0")
  t_back=$(now)
  submit_retry "after-$key" 1 1 "exit 0"
  wait_for 60 "job after-$key to succeed" phase_is "after-$key" Succeeded
  recovery_s=$(elapsed "$t_back")
  echo "$label restarted in ${restart_s}s; a new job succeeded ${recovery_s}s later"
}

# etcd restart while everything runs.
timed_restart etcd restart-etcd etcd
etcd_affected=$affected etcd_restart_s=$restart_s etcd_recovery_s=$recovery_s

# API-server restart (with the controller manager) while long and end-in-api still run.
wait_for 60 "job end-in-etcd to succeed" phase_is end-in-etcd Succeeded
phase_is end-in-api Running || fail "job end-in-api is not running before the API-server restart"
timed_restart api restart-apiserver "API server"
api_affected=$affected api_restart_s=$restart_s api_recovery_s=$recovery_s

wait_for 60 "job end-in-api to succeed" phase_is end-in-api Succeeded
sleep 2 # anything the restarts left pending would show now

starts() { # pod incarnations of a job started by the node agent since this test began
  tail -n +"$((agent_log_start + 1))" "$agent_log" | grep "pod started" | grep -c "pod=$ns/$1-worker-" || true
}
jobs_ok=0
check() { # check JOB PHASE RESTARTS GENERATION PODS-STARTED
  local j=$1
  [ "$(jp "$j" '{.status.phase}')" = "$2" ] || fail "$j: phase $(jp "$j" '{.status.phase}'), want $2"
  [ "$(jp "$j" '{.status.restarts}')" = "$3" ] || fail "$j: restarts $(jp "$j" '{.status.restarts}'), want $3"
  [ "$(jp "$j" '{.status.generation}')" = "$4" ] || fail "$j: generation $(jp "$j" '{.status.generation}'), want $4"
  [ "$(starts "$j")" = "$5" ] || fail "$j: $(starts "$j") pods started, want $5 (duplicates or lost pods)"
  jobs_ok=$((jobs_ok + 1))
}
check long Running 0 1 2
[ "$(kubectl get pods -n "$ns" -l railyard.dev/job=long --no-headers | wc -l)" = 2 ] || fail "long: not exactly 2 pods"
check end-in-etcd Succeeded 0 1 1
check end-in-api Succeeded 1 2 2
[ "$(jp end-in-api '{.status.lastRestart.reason}')" = PodFailed ] || fail "end-in-api: lastRestart.reason"
check after-etcd Succeeded 0 1 1
check after-api Succeeded 0 1 1
kill -0 "$op_pid" 2>/dev/null || fail "the operator exited"
bash "$cluster" status --state-dir "$state" >/dev/null || fail "the cluster is not healthy after the restarts"

secs=$((SECONDS - t_start))
if [ -n "${RAILYARD_RESULTS_DIR:-}" ]; then
  mkdir -p "$RAILYARD_RESULTS_DIR"
  cat >"$RAILYARD_RESULTS_DIR/restarts.json" <<JSON
{"test": "e2e_control_plane_restarts", "date": "$(date -u +%FT%TZ)", "seconds": $secs, "passed": true,
 "faults": [
  {"kind": "etcd restart", "count": 1, "jobs_affected": $etcd_affected, "jobs_correct": $etcd_affected, "downtime_s": $etcd_restart_s,
   "recovery_s": $etcd_recovery_s, "steps_lost": null},
  {"kind": "API-server restart", "count": 1, "jobs_affected": $api_affected, "jobs_correct": $api_affected, "downtime_s": $api_restart_s,
   "recovery_s": $api_recovery_s, "steps_lost": null}],
 "jobs": $jobs_ok, "jobs_correct": $jobs_ok}
JSON
fi
echo "control-plane restarts e2e: ok in ${secs}s ($jobs_ok jobs correct)"
