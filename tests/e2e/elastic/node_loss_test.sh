#!/usr/bin/env bash
# E2E flow 2 (issue #10) with the peer copy of the in-memory tier (issue #6 item 4, docs/checkpointing.md "The peer
# copy"): a node is lost. A 2-replica data-parallel job (deterministic mode) keeps the in-memory tier every step
# (spec.checkpoint.memoryIntervalSteps: 1); each pod's agent streams its rank's slots to the other pod's agent. Then
# (once pod 0's copy has caught up with rank 1's newest slot, see below) `railyard-node-agent node-down` takes pod 1's
# node away (its processes get SIGKILL, nothing is saved, its shared
# memory is gone with it). The operator re-creates pod 1 on another node; its new agent fetches rank 1's copies from
# pod 0's agent before it starts the trainer; rank 1 restores `from=peer`, rank 0 `from=memory`, the same step, at
# most one memory interval (one step) behind what generation 1 reported; the job ends Succeeded with bitwise the
# undisturbed run's final parameters, and no shared-memory segment of the namespace is left.
set -euo pipefail
job_name=nodeloss
job_memory=1
job_deterministic=1
# Rank 1's trainer is stopped on purpose below, to pin the moment of the node loss: the agent's own hang watch would
# restart the job first (it finds a stopped rank in about 1 s), so it is off in this job.
job_agent_hang=off
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
steps=$fault_steps
start_two_replica_job "$steps"
node0=$(pod_node "$job_name-worker-0")
node1=$(pod_node "$job_name-worker-1")
[ -n "$node1" ] && [ "$node0" != "$node1" ] || fail "the pods share node '$node0' (want one per node)"
wait_for 90 "a first checkpoint" latest_at_least 10

# Each pod holds its own rank's two slots and the other pod's copies (<agent prefix>-peer-r<rank>-a|b).
shm_count() { find /dev/shm -maxdepth 1 -name "$1" 2>/dev/null | wc -l; }
wait_for 20 "pod 0 to hold both copies of rank 1" \
  bash -c "[ \$(find /dev/shm -maxdepth 1 -name 'railyard-${ns}_$job_name-worker-0-*-peer-r1-?' | wc -l) = 2 ]"
[ "$(shm_count "railyard-${ns}_$job_name-worker-1-*-peer-r0-?")" = 2 ] || fail "pod 1 holds no copies of rank 0"
grep -q 'peer copies of the in-memory checkpoint tier' "$(pod_log "$job_name-worker-0")" ||
  fail "pod 0's agent serves no peer copies"

log0=$(pod_log "$job_name-worker-0")
log1=$(pod_log "$job_name-worker-1")
# The copy lags the puts by up to a copy time: on this 2-core machine, with two trainers and other work, a copy of the
# 10 MB slot took 0.1-0.2 s against steps of ~0.1 s, so at a random moment pod 0 may hold rank 1's step N-2 while the
# survivors hold N and N-1, and the restore then reads the disk (docs/checkpointing.md says so). To assert the restore
# path rather than that race, the moment is pinned: rank 1's trainer is stopped (SIGSTOP; rank 0 then blocks in the
# next collective), pod 0's copy catches up with rank 1's newest step (read from the slots' headers: state word at
# byte 12, step at 24), and then the node goes down (SIGKILL to everything on it, as before). Under load the copy can
# stay behind for several steps: the ranks then put their newest steps into the third slot, never copied
# (docs/checkpointing.md "The survivors keep a step the peer holds"), the two copied slots keep older steps, and the
# disk checkpoint may be newer than they are; a loss then restores from the disk, rightly, and no stop lets the copy
# catch up with the third slot. So a moment counts only when pod 0 holds rank 1's newest step in any slot and one at
# least as new as the disk; else rank 1 runs on a little (SIGCONT, 0.4 s) and is stopped again, up to 15 times.
caught_up() { # [DISK-STEP]: pod 0 holds rank 1's newest step, and one at least DISK-STEP
  python3 - "/dev/shm" "railyard-${ns}_$job_name-worker-1-" "railyard-${ns}_$job_name-worker-0-" "${1:--1}" <<'PY'
import os, struct, sys
d, own, holder, disk = sys.argv[1:]
def steps(match):
    out = []
    for f in os.listdir(d):
        if match(f):
            try:
                with open(os.path.join(d, f), "rb") as fh:
                    h = fh.read(32)
                state, step = struct.unpack_from("<I", h, 12)[0], struct.unpack_from("<q", h, 24)[0]
                if state == 2:
                    out.append(step)
            except OSError:
                pass
    return out
# Rank 1's newest step in any of its slots, the third (never copied) included: pod 0 must hold that one.
mine = steps(lambda f: f.startswith(own) and "-peer-" not in f and f.endswith(("-r1-a", "-r1-b", "-r1-c")))
held = steps(lambda f: f.startswith(holder) and f.endswith(("-peer-r1-a", "-peer-r1-b")))
sys.exit(0 if mine and held and max(held) >= max(mine) and max(held) >= int(disk) else 1)
PY
}
t1=$(trainer_pid "$job_name-worker-1")
[ -n "$t1" ] || fail "no trainer process under pod 1's agent"
pinned=0 stops=0
for _ in $(seq 15); do
  kill -STOP "$t1"
  stops=$((stops + 1))
  # The copy of the copied slots catches up within a copy time; the third slot's step, if newer, never does.
  for _ in $(seq 20); do caught_up && break; sleep 0.1; done
  if caught_up "$(latest_step)"; then
    pinned=1
    break
  fi
  kill -CONT "$t1"
  sleep 0.4
done
[ "$pinned" = 1 ] || fail "pod 0 never held rank 1's newest step (and one as new as the disk's $(latest_step)) in 15 stops"
t_down=$(date +%s.%N)
agent_ctl node-down "$node1" >/dev/null
nodes_down+=("$node1")
echo "node $node1 (pod $job_name-worker-1) down at step $(steps_of "$job_name-worker-0" | tail -1 | cut -d' ' -f1), checkpoint $(latest_step), pinned after $stops stop(s)"
wait_for 40 "the restart" bash -c "[ \"\$(kubectl get tj $job_name -n $ns -o jsonpath='{.status.restarts}')\" -ge 1 ]"
new_pod() {
  u=$(pod_uid "$job_name-worker-1") && [ -n "$u" ] && [ "$u" != "$uid1" ] && n=$(pod_node "$job_name-worker-1") &&
    [ -n "$n" ] && [ "$n" != "$node1" ]
}
wait_for 60 "a replacement pod on another node" new_pod
echo "replacement pod $job_name-worker-1 on $(pod_node "$job_name-worker-1"), reason $(jp '{.status.lastRestart.reason}')"
# The generation-1 steps rank 0 reported before the loss (its log is appended across generations).
gen1_last=$(sed -n '/checkpoint: restored /q;p' "$log0" | grep -oE 'worker: step step=[0-9]+' | tail -1 | cut -d= -f2)

# The replacement's agent fetched rank 1's copies from pod 0 before starting its trainer.
wait_for 60 "rank 1 to restore" bash -c "grep -q 'checkpoint: restored ' '$log1'"
wait_for 60 "rank 0 to restore" bash -c "grep -q 'checkpoint: restored ' '$log0'"
t_restored=$(date +%s.%N)
fetch_line=$(grep 'fetched the peer copies of a rank' "$log1" | tail -1)
[ -n "$fetch_line" ] || fail "the replacement's agent fetched no peer copy: $(grep -E 'peer cop' "$log1" | tail -3)"
echo "agent: $fetch_line"
r0=$(restored_step "$job_name-worker-0")
r1=$(restored_step "$job_name-worker-1")
[ "$(restored_from "$job_name-worker-1")" = peer ] ||
  fail "rank 1 restored from '$(restored_from "$job_name-worker-1")', want peer: $(grep 'checkpoint: ' "$log1" | tail -3)"
[ "$(restored_from "$job_name-worker-0")" = memory ] || fail "rank 0 restored from '$(restored_from "$job_name-worker-0")', want memory"
[ "$r0" = "$r1" ] || fail "ranks restored different steps: $r0 and $r1"
# Steps lost: the copy lags the put by up to one memory interval, so the step every rank holds is at most one behind
# what generation 1 reported (it can also be one ahead: every rank held it, the loss came before rank 0 logged it).
lost=$((gen1_last - r0))
[ "$lost" -le 1 ] || fail "restored step $r0 but generation 1 reported $gen1_last: $lost steps lost, want at most 1"
[ "$r0" -le $((gen1_last + 1)) ] || fail "restored step $r0 is more than one past generation 1's last report $gen1_last"
restore_s=$(grep 'checkpoint: restored ' "$log1" | tail -1 | grep -oE ' seconds=[0-9.]+' | cut -d= -f2)
check_first_step_after_restore "$r0"
t_step=$(date +%s.%N)

wait_succeeded 180
[ "$(jp '{.status.progress}')" = "$steps/$steps" ] || fail "progress '$(jp '{.status.progress}')'"
check_final_undisturbed "$steps"
# The agents remove their segments and the copies they held when they exit; the lost pod's were removed by the
# replacement's agent (same pod name) at its start.
wait_for 30 "no shared-memory segment of the namespace" bash -c "[ \$(find /dev/shm -maxdepth 1 -name 'railyard-${ns}_*' | wc -l) = 0 ]"
python3 - "$t_down" "$t_restored" "$t_step" <<'PY'
import sys
d, r, s = map(float, sys.argv[1:])
print(f"node loss: both ranks restored {r - d:.1f} s after node-down, first step after the restore seen {s - d:.1f} s after it")
PY
echo "node loss e2e: ok (restored step $r0 from=peer on the replacement, generation 1 reported $gen1_last: $((lost < 0 ? 0 : lost)) steps lost; rank 1's restore ${restore_s} s; final loss ${last#* }, final parameters bitwise the undisturbed run's, sha256 ${params_sha:0:16})"
