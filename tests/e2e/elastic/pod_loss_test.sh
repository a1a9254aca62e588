#!/usr/bin/env bash
# E2E flow 2 (issue #10): a worker pod is deleted, and flow 5 (preemption): it saves within its grace period.
# A 2-replica data-parallel job trains the tiny model with a checkpoint every 5 steps; once a checkpoint exists, pod 1
# is deleted (default grace: its agent forwards SIGTERM and the trainer saves the step it is in before exiting). The
# operator opens a new generation and re-creates the pod under the same name (new UID), the scheduler binds it, both
# ranks restore exactly the step saved on SIGTERM and continue from the step after it, and the job ends Succeeded
# with the undisturbed run's final loss and bitwise its final parameters (deterministic mode).
set -euo pipefail
job_name=podloss
job_deterministic=1
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
start_fault_run
t_delete=$(date +%s.%N)
kubectl delete pod "$job_name-worker-1" -n "$ns" --wait=false >/dev/null
echo "deleted pod $job_name-worker-1 (uid $uid1) after checkpoint step $(latest_step)"
wait_for 30 "the restart" bash -c "[ \"\$(kubectl get tj $job_name -n $ns -o jsonpath='{.status.restarts}')\" -ge 1 ]"
reason=$(jp '{.status.lastRestart.reason}')
case "$reason" in PodDeleted | PodLost | WorkerExit) ;; *) fail "lastRestart.reason '$reason'" ;; esac
new_pod() { u=$(pod_uid "$job_name-worker-1") && [ -n "$u" ] && [ "$u" != "$uid1" ] && [ -n "$(pod_node "$job_name-worker-1")" ]; }
wait_for 60 "a replacement pod, bound to a node" new_pod
t_replaced=$(date +%s.%N)
echo "replacement pod $job_name-worker-1 (uid $(pod_uid "$job_name-worker-1")) on $(pod_node "$job_name-worker-1")"
[ "$(pod_uid "$job_name-worker-0")" = "$uid0" ] || fail "pod 0 was re-created, only pod 1 was lost"
wait_for 60 "the job to run again" phase_is Running
gen=$(jp '{.status.generation}')
[ "$gen" -ge 2 ] || fail "generation $gen after the pod loss"

# The replacement's log is new (a new pod under the same name appends to the same file: take the last restore).
log0=$(pod_log "$job_name-worker-0")
log1=$(pod_log "$job_name-worker-1")
wait_for 60 "rank 1 of generation $gen to restore" bash -c "grep -q 'checkpoint: restored ' '$log1'"
wait_for 60 "rank 0 of generation $gen to restore" bash -c "grep -q 'checkpoint: restored ' '$log0'"
r0=$(restored_step "$job_name-worker-0")
r1=$(restored_step "$job_name-worker-1")
[ "$r0" = "$r1" ] || fail "ranks restored different steps: $r0 and $r1"
[ "$r0" -gt 0 ] || fail "restored step $r0 (a fresh start)"
# Preemption (issue #10 flow 5): the deleted pod's trainer saved the step it was in within the grace period, and the
# new generation restores exactly that step: no step is lost.
stop_save=$(grep 'checkpoint: saved on stop signal ' "$log1" | tail -1 | grep -oE ' step=[0-9]+' | cut -d= -f2)
[ -n "$stop_save" ] || fail "the deleted pod's trainer did not save on SIGTERM: $(grep 'stop signal' "$log1" | tail -2)"
[ "$r0" = "$stop_save" ] || fail "restored step $r0, but the deleted pod's trainer saved step $stop_save on SIGTERM"
# That save is a checkpoint on disk and both ranks restored from its directory (a restore verifies the manifest and
# the checksums; the directory itself may already be gone: the job keeps its newest few checkpoints).
stop_dir=$work/ckpt/$job_name/$(printf 'step-%08d' "$stop_save")
for i in 0 1; do
  [ "$(restored_from "$job_name-worker-$i")" = "$stop_dir" ] ||
    fail "$job_name-worker-$i restored from '$(restored_from "$job_name-worker-$i")', not the checkpoint saved on SIGTERM ($stop_dir)"
done
check_first_step_after_restore "$r0"
t_step=$(date +%s.%N)
wait_succeeded 180
[ "$(jp '{.status.progress}')" = "$steps/$steps" ] || fail "progress '$(jp '{.status.progress}')'"
restarts=$(jp '{.status.restarts}')
[ "$restarts" -ge 1 ] && [ "$restarts" -le 2 ] || fail "restarts $restarts, want 1 (2 if the agent's exit report races the pod deletion)"
check_final_undisturbed "$steps"
python3 -c "import sys; sys.exit(0 if 0 < float(sys.argv[1]) < 4.5 else 1)" "${last#* }" ||
  fail "final loss ${last#* } not below 4.5"
python3 - "$t_delete" "$t_replaced" "$t_step" <<'PY'
import sys
d, r, s = map(float, sys.argv[1:])
print(f"pod loss: replacement bound {r - d:.1f} s after the delete, first step after the restore seen {s - d:.1f} s "
      f"after it")
PY
echo "pod loss e2e: ok (reason $reason, restored step $r0 = the step saved on SIGTERM, restarts $restarts, final loss ${last#* }, final parameters bitwise the undisturbed run's, sha256 ${params_sha:0:16})"
