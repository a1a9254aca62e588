#!/usr/bin/env bash
# E2E flow 6 (issue #10): the control plane restarts in the middle of a recovery, and the job still converges.
# A 2-replica data-parallel job (tiny model, deterministic mode, checkpoint every 5 steps, in-memory tier every step)
# goes through two failures:
#  1. rank 1's trainer gets SIGKILL and, a moment later, the operator too (SIGKILL, before or while it opens the new
#     generation); a new operator process (same rendezvous port) takes over: the exit report must not be lost and
#     must not be counted twice, the workers restart in place (same pods) and restore from memory (zero steps lost).
#  2. pod 1 is deleted and the API server (with the controller manager) is restarted at once
#     (`cluster.sh restart-apiserver`), so the operator handles the pod loss across the API server's absence: one
#     restart, a replacement pod, a restore at most one checkpoint interval back (the deleted pod saves on SIGTERM).
# Asserted at the end: Succeeded, status.restarts exactly 2 and generation 3 (one generation per restart), the
# agents joined exactly generations 1, 2, 3, steps lost 0 then <= 5, and the final parameters bitwise equal to the
# undisturbed run's. Prints the times of each recovery.
set -euo pipefail
job_name=ctlplane
job_memory=1
job_deterministic=1
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
cluster=$src/deploy/local/cluster.sh
steps=200
rdzv_port=$(free_port)
op_extra="--rendezvous-bind 127.0.0.1:$rdzv_port"
start_two_replica_job "$steps"
log0=$(pod_log "$job_name-worker-0")
log1=$(pod_log "$job_name-worker-1")
wait_for 90 "a first checkpoint" latest_at_least 10

# --- Phase 1: kill -9 a trainer, then the operator, while the restart is being handled.
worker_pid=$(trainer_pid "$job_name-worker-1")
[ -n "$worker_pid" ] || fail "no trainer process in pod $job_name-worker-1"
t_kill=$(ts_now)
kill -9 "$worker_pid"
sleep "${RAILYARD_E2E_OP_KILL_DELAY:-0.1}" # 0: the operator may die before it handles the exit report
restarts_when_killed=$(jp '{.status.restarts}')
kill_operator
echo "phase 1: killed rank 1's trainer (pid $worker_pid), then the operator ${RAILYARD_E2E_OP_KILL_DELAY:-0.1} s later (status.restarts was '${restarts_when_killed:-0}')"
sleep 2 # the agents see the service gone (connection refused) and keep polling
restart_operator
t_op_back=$(ts_now)
wait_for 60 "the restart" restarts_is 1
[ "$(jp '{.status.lastRestart.reason}')" = WorkerExit ] || fail "lastRestart.reason '$(jp '{.status.lastRestart.reason}')', want WorkerExit"
wait_for 60 "both ranks to restore" bash -c "grep -q 'checkpoint: restored ' '$log0' && grep -q 'checkpoint: restored ' '$log1'"
r1=$(restored_step "$job_name-worker-0")
check_both_from_memory "$r1" "phase 1"
gen1_last=$(sed -n '/checkpoint: restored /q;p' "$log0" | grep -oE 'worker: step step=[0-9]+' | tail -1 | cut -d= -f2)
lost1=$((gen1_last > r1 ? gen1_last - r1 : 0))
[ "$lost1" = 0 ] || fail "phase 1: restored step $r1 but generation 1 had reported $gen1_last: $lost1 steps lost, want 0"
[ "$r1" -le $((gen1_last + 1)) ] || fail "phase 1: restored step $r1 is more than one past generation 1's last report $gen1_last"
[ "$(pod_uid "$job_name-worker-0")" = "$uid0" ] && [ "$(pod_uid "$job_name-worker-1")" = "$uid1" ] ||
  fail "phase 1: a pod was re-created for a process failure"
wait_for 60 "generation 2 to train 10 steps" bash -c "[ \"\$(kubectl get tj $job_name -n $ns -o jsonpath='{.status.step}')\" -ge $((r1 + 10)) ]"
[ "$(jp '{.status.restarts}')" = 1 ] || fail "phase 1: restarts $(jp '{.status.restarts}') after the operator restart, want 1"
[ "$(jp '{.status.generation}')" = 2 ] || fail "phase 1: generation $(jp '{.status.generation}'), want 2"
echo "phase 1: restored step $r1 from memory (generation 1 reached $gen1_last): 0 steps lost; restarts 1"

# --- Phase 2: delete pod 1 and restart the API server while the operator handles it.
n_restored0=$(grep -c 'checkpoint: restored ' "$log0")
step_before=$(jp '{.status.step}')
t_delete=$(ts_now)
kubectl delete pod "$job_name-worker-1" -n "$ns" --wait=false >/dev/null
bash "$cluster" restart-apiserver --state-dir "$state" >"$work/cluster.log" 2>&1 || fail "restart-apiserver failed: $(tail -5 "$work/cluster.log")"
t_api_back=$(ts_now)
echo "phase 2: deleted pod $job_name-worker-1 at step $step_before and restarted the API server ($(python3 -c "print(round($t_api_back - $t_delete, 1))") s)"
new_pod() { u=$(pod_uid "$job_name-worker-1") && [ -n "$u" ] && [ "$u" != "$uid1" ] && [ -n "$(pod_node "$job_name-worker-1")" ]; }
wait_for 90 "a replacement pod, bound to a node" new_pod
wait_for 90 "rank 0 to restore again" bash -c "[ \$(grep -c 'checkpoint: restored ' '$log0') -gt $n_restored0 ]"
r2=$(restored_step "$job_name-worker-0")
wait_for 60 "the replacement to restore" bash -c "grep 'checkpoint: restored ' '$log1' | tail -1 | grep -q ' step=$r2 '"
# Steps lost: what generation 2 had reported (rank 0 logs every step) minus the step the next generation restored.
gen2_last=$(awk '/checkpoint: restored /{n++} n==1' "$log0" | grep -oE 'worker: step step=[0-9]+' | tail -1 | cut -d= -f2)
lost2=$((gen2_last > r2 ? gen2_last - r2 : 0))
[ "$r2" -gt "$r1" ] || fail "phase 2: restored step $r2, not after phase 1's $r1"
[ "$lost2" -le 5 ] || fail "phase 2: $lost2 steps lost (generation 2 reached $gen2_last, restored $r2), want <= the checkpoint interval 5"
first_after() { awk -v n="$1" '/checkpoint: restored /{c++} c==n' "$log0" | grep -oE 'worker: step step=[0-9]+' | head -1 | cut -d= -f2; }
wait_for 60 "the first step after the second restore" bash -c "$(declare -f first_after); log0='$log0'; [ -n \"\$(first_after $((n_restored0 + 1)))\" ]"
[ "$(first_after $((n_restored0 + 1)))" = $((r2 + 1)) ] || fail "phase 2: first step after the restore $(first_after $((n_restored0 + 1))), want $((r2 + 1))"
t_step2=$(ts_now)
[ "$(pod_uid "$job_name-worker-0")" = "$uid0" ] || fail "phase 2: pod 0 was re-created, only pod 1 was lost"
echo "phase 2: restored step $r2 (generation 2 reached $gen2_last): $lost2 steps lost"

wait_succeeded 240
kill -0 "$op_pid" 2>/dev/null || fail "the operator exited"
[ "$(jp '{.status.progress}')" = "$steps/$steps" ] || fail "progress '$(jp '{.status.progress}')'"
# Exact count: two failures, two restarts, one generation each; the agents joined exactly generations 1, 2, 3.
[ "$(jp '{.status.restarts}')" = 2 ] || fail "restarts $(jp '{.status.restarts}'), want exactly 2 (a duplicate or a lost count)"
[ "$(jp '{.status.generation}')" = 3 ] || fail "generation $(jp '{.status.generation}'), want 3"
gens0=$(grep -oE 'agent: joined generation=[0-9]+' "$log0" | cut -d= -f2 | sort -un | tr '\n' ' ')
[ "$gens0" = "1 2 3 " ] || fail "rank 0's agent joined generations '$gens0', want '1 2 3 '"
check_final_undisturbed "$steps"
python3 - "$log0" "$log1" "$t_kill" "$t_op_back" "$t_delete" "$t_api_back" "$t_step2" <<'PY'
import sys
from datetime import datetime
def ts(line): return datetime.strptime(line[:23], "%Y-%m-%dT%H:%M:%S.%f").timestamp()
log0 = open(sys.argv[1]).read().splitlines()
kill, op_back, delete, api_back, step2 = map(float, sys.argv[3:])
i = next(i for i, l in enumerate(log0) if "checkpoint: restored " in l)
step1 = ts(next(l for l in log0[i:] if "worker: step step=" in l))
print(f"control plane: phase 1 kill -> first step of generation 2 {step1 - kill:.1f} s (operator back "
      f"{op_back - kill:.1f} s after the kill); phase 2 delete -> API server back {api_back - delete:.1f} s, "
      f"-> first step of generation 3 seen {step2 - delete:.1f} s")
PY
echo "control plane e2e: ok (restarts 2, generation 3, steps lost 0 and $lost2, final loss ${last#* }, final parameters bitwise the undisturbed run's, sha256 ${params_sha:0:16})"
