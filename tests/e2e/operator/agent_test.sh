#!/usr/bin/env bash
# E2E: railyard-operator with the worker agent and the rendezvous service on the real local cluster. Pods run
# `railyard-worker agent -- sh -c ...` (the operator's --worker-command plus the job's template args), join the
# leader's rendezvous, and the operator sees process exits through it: a retryable exit restarts every agent's
# workers in a new generation without new pods, a permanent exit fails the job at once, and a clean finish of
# every rank makes the job Succeeded.
set -euo pipefail
# shellcheck source=../lib/cluster_env.sh
source "${RAILYARD_SOURCE_DIR:?}/tests/e2e/lib/cluster_env.sh" op-agent-e2e railyard-worker
agent_bin=$bin/railyard-worker
op_pid=""
fail() {
  echo "FAIL: $*" >&2
  kubectl get tj,pods -n "$ns" -o wide >&2 || true
  kubectl get tj -n "$ns" -o jsonpath='{range .items[*]}{.metadata.name}{": "}{.status}{"\n"}{end}' >&2 || true
  tail -n 40 "$work/op.log" >&2
  exit 1
}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
trap cleanup_operator_ns EXIT
jp() { kubectl get tj "$1" -n "$ns" -o jsonpath="$2" 2>/dev/null; }
phase_is() { [ "$(jp "$1" '{.status.phase}')" = "$2" ]; }
restarts_is() { [ "$(jp "$1" '{.status.restarts}')" = "$2" ]; }
pod_uids() { kubectl get pods -n "$ns" -l "railyard.dev/job=$1" -o jsonpath='{.items[*].metadata.uid}'; }

# shellcheck source=../lib/job_manifest.sh
source "$src/tests/e2e/lib/job_manifest.sh"
job() { job_manifest "$1" replicas="$2" procs="$3" agent="$4" maxRestarts=2; } # job NAME REPLICAS PROCS SCRIPT

install_crd "$src"
kubectl create namespace "$ns" >/dev/null
wait_for 60 "the default service account token" \
  bash -c "kubectl get sa default -n $ns -o jsonpath='{.secrets[0].name}' | grep -q ."
# The frozen pod below shows the join timeout: the silence rule (which would replace it after 4 s) is off here and
# tested in e2e_elastic_agent_hang.
"$bin/railyard-operator" --namespace "$ns" --leader-elect=false --worker-command "$agent_bin" --join-timeout 3 \
  --agent-silence-seconds 0 \
  --metrics-addr "127.0.0.1:$(free_port)" --health-addr "127.0.0.1:$(free_port)" --rendezvous-bind 127.0.0.1:0 \
  >"$work/op.log" 2>&1 &
op_pid=$!
wait_for 30 "the operator to start" grep -q "leading: reconciling" "$work/op.log"

# Rank 1 dies with a retryable code (137) in generation 1; generation 2 runs to the end.
job inplace 2 2 'echo rank $RANK of $WORLD_SIZE gen $RAILYARD_GENERATION; if [ $RAILYARD_GENERATION = 1 ] && [ $RANK = 1 ]; then sleep 2; exit 137; fi; sleep 6' |
  kubectl apply -n "$ns" -f - >/dev/null
wait_for 60 "job inplace to run" phase_is inplace Running
uids=$(pod_uids inplace)
wait_for 60 "the in-place restart" restarts_is inplace 1
[ "$(jp inplace '{.status.lastRestart.reason}')" = WorkerExit ] || fail "lastRestart.reason $(jp inplace '{.status.lastRestart.reason}')"
[ "$(jp inplace '{.status.lastRestart.rank}')" = 1 ] || fail "lastRestart.rank $(jp inplace '{.status.lastRestart.rank}')"
[ "$(jp inplace '{.status.lastRestart.detector}')" = agent ] || fail "lastRestart.detector"
wait_for 30 "generation 2 to run" phase_is inplace Running
[ "$(pod_uids inplace)" = "$uids" ] || fail "pods were re-created for a process failure"
wait_for 90 "job inplace to succeed" phase_is inplace Succeeded
[ "$(jp inplace '{.status.generation}')" = 2 ] || fail "generation $(jp inplace '{.status.generation}')"
[ "$(jp inplace '{.status.conditions[?(@.type=="Succeeded")].reason}')" = AllRanksSucceeded ] || fail "Succeeded reason"
echo "in-place restart: WorkerExit rank 1 -> generation 2 with the same pods -> Succeeded"

# A permanent exit code (3) fails the job at once, and the job says why in the rank's own words: its last stderr
# lines (colour codes stripped) reach status.lastFailure.message, the Failed condition and the Warning event. Its pods
# are kept for inspection (cleanPodPolicy Running, the default), stopped: rank 1's agent ends its `sleep 600`.
job perm 2 1 'if [ $RANK = 0 ]; then sleep 1; echo loading the model; printf '\''\\033[31merror: initFrom /etc/passwd is not a checkpoint\\033[0m\\n'\'' >&2; exit 3; fi; sleep 600' |
  kubectl apply -n "$ns" -f - >/dev/null
wait_for 60 "job perm to fail" phase_is perm Failed
perm_failed_at=$SECONDS
[ "$(jp perm '{.status.conditions[?(@.type=="Failed")].reason}')" = PermanentExitCode ] || fail "perm reason"
[ "$(jp perm '{.status.restarts}')" = 0 ] || fail "perm restarted"
cause="error: initFrom /etc/passwd is not a checkpoint"
last=$(jp perm '{.status.lastFailure.message}')
[ "$last" = "rank 0 (pod perm-worker-0) exited with code 3: $cause" ] || fail "lastFailure.message: $last"
cond=$(jp perm '{.status.conditions[?(@.type=="Failed")].message}')
grep -qF "(a permanent exit code: failing without restart): $cause" <<<"$cond" || fail "Failed condition: $cond"
perm_event() {
  kubectl get events -n "$ns" --field-selector involvedObject.name=perm,reason=Failed,type=Warning \
    -o jsonpath='{range .items[*]}{.message}{"\n"}{end}' | grep -qF "PermanentExitCode: rank 0 (pod perm-worker-0) exited with code 3 (a permanent exit code: failing without restart): $cause"
}
wait_for 30 "the Failed event naming the cause" perm_event
# Both pods end (rank 0's failed, rank 1's stopped by its agent when the job closed) and stay.
pods_ended() {
  local phases
  phases=$(kubectl get pods -n "$ns" -l railyard.dev/job=perm -o jsonpath='{range .items[*]}{.status.phase}{" "}{end}')
  [ "$(wc -w <<<"$phases")" = 2 ] && ! grep -qE "Running|Pending|Unknown" <<<"$phases"
}
wait_for 30 "perm's pods to end" pods_ended
echo "permanent exit through the agent: Failed at once, saying why: $last; pods ended and kept"
kubectl delete tj inplace -n "$ns" >/dev/null

# A pod that cannot re-join (its processes frozen) surfaces as Running=False, reason JoinTimeout, naming the pod;
# once thawed, its agent joins the new generation and the job runs again.
job stuck 2 1 'sleep 600' | kubectl apply -n "$ns" -f - >/dev/null
wait_for 60 "job stuck to run" phase_is stuck Running
"$bin/railyard-node-agent" freeze "$ns/stuck-worker-1" --state-dir "$state/node-agent" >/dev/null
kubectl annotate tj stuck -n "$ns" railyard.dev/restart-request=r1 >/dev/null
running_reason() { [ "$(jp stuck '{.status.conditions[?(@.type=="Running")].reason}')" = "$1" ]; }
wait_for 60 "the join timeout condition" running_reason JoinTimeout
msg=$(jp stuck '{.status.conditions[?(@.type=="Running")].message}')
grep -q "stuck-worker-1" <<<"$msg" || fail "JoinTimeout message does not name the pod: $msg"
"$bin/railyard-node-agent" thaw "$ns/stuck-worker-1" --state-dir "$state/node-agent" >/dev/null
wait_for 60 "job stuck to run again" phase_is stuck Running
echo "join timeout: $msg; thawed pod re-joined"
# The failed job's pods are still there once cleanPodPolicy's stop wait (20 s after the end) has passed.
[ $((SECONDS - perm_failed_at)) -ge 25 ] || sleep $((25 - (SECONDS - perm_failed_at)))
pods_ended || fail "perm's pods were not kept: $(kubectl get pods -n "$ns" -l railyard.dev/job=perm 2>&1)"
kubectl get pods -n "$ns" -l railyard.dev/job=perm -o jsonpath='{.items[*].metadata.deletionTimestamp}' | grep -q . &&
  fail "perm's pods are being deleted"
kubectl delete tj perm -n "$ns" >/dev/null
echo "a failed job's pods: kept past the stop wait"
echo "operator agent e2e: ok"
