#!/usr/bin/env bash
# E2E flow 7 (issue #10, "bad luck twice"): a second failure during recovery. Rank 1's trainer is killed (kill -9);
# as soon as the operator has opened generation 2 and rank 0's agent has started its new trainer, that trainer is
# killed too, before the new generation gets going. The operator opens generation 3 in the same pods, the ranks
# restore the newest checkpoint, and the job ends Succeeded with 2 restarts, the undisturbed run's final loss and
# bitwise its final parameters (deterministic mode).
set -euo pipefail
job_name=twice
job_deterministic=1
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
start_fault_run
old0=$(trainer_pid "$job_name-worker-0")
p1=$(trainer_pid "$job_name-worker-1")
[ -n "$old0" ] && [ -n "$p1" ] || fail "trainer processes not found (rank 0: '$old0', rank 1: '$p1')"
agent0=$(ps -o ppid= -p "$old0" | tr -d ' ')
kill -9 "$p1"
echo "first failure: killed rank 1's trainer (pid $p1) after checkpoint step $(latest_step)"
# Polled without the API server, so the second kill lands while generation 2 is still restoring.
t0=$SECONDS
until p0=$(pgrep -P "$agent0" | head -1) && [ -n "$p0" ] && [ "$p0" != "$old0" ]; do
  [ $((SECONDS - t0)) -lt 30 ] || fail "rank 0's agent started no trainer for generation 2 within 30 s"
  sleep 0.02
done
kill -9 "$p0"
echo "second failure during recovery: killed rank 0's new trainer (pid $p0)"
wait_for 30 "the second restart" restarts_is 2
gen2_steps=$(awk '/agent: worker started generation=2 /{on=1} /agent: worker started generation=3 /{on=0} on && /worker: step step=/{n++} END{print n+0}' "$(pod_log "$job_name-worker-0")")
[ "$gen2_steps" = 0 ] || fail "the second failure came after generation 2 had trained $gen2_steps steps: not during recovery"
[ "$(jp '{.status.lastRestart.reason}')" = WorkerExit ] || fail "lastRestart.reason '$(jp '{.status.lastRestart.reason}')'"
wait_for 60 "generation 3 to run" bash -c "[ \"\$(kubectl get tj $job_name -n $ns -o jsonpath='{.status.generation}')\" -ge 3 ]"
wait_for 60 "the job to run again" phase_is Running
[ "$(pod_uid "$job_name-worker-0")" = "$uid0" ] || fail "pod 0 was re-created for a process failure"
[ "$(pod_uid "$job_name-worker-1")" = "$uid1" ] || fail "pod 1 was re-created for a process failure"
wait_succeeded 180
restarts=$(jp '{.status.restarts}')
[ "$restarts" = 2 ] || fail "restarts $restarts, want 2"
[ "$(jp '{.status.progress}')" = "$steps/$steps" ] || fail "progress '$(jp '{.status.progress}')'"
r=$(restored_step "$job_name-worker-0")
[ "$r" -gt 0 ] || fail "the last generation restored step $r (a fresh start)"
check_final_undisturbed "$steps"
echo "double failure e2e: ok (generation $(jp '{.status.generation}'), restarts 2, last restore step $r, final loss ${last#* }, final parameters bitwise the undisturbed run's, sha256 ${params_sha:0:16})"
