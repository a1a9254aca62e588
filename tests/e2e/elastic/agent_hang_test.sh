#!/usr/bin/env bash
# E2E (issue 44 item 1): hangs found by the pod's agent (worker/agent/hang_watch.h), with no monitor running at all.
# Job 1: 2 replicas (data parallel), validation every 10 steps, a synchronous checkpoint every 5, the in-memory tier
# every step, the agents' defaults. Its pauses (validation, synchronous saves: marked in the progress file) and the
# first steps of each generation cause no restart. Then rank 1's trainer gets SIGSTOP: its agent sees the process
# stopped (state T, no CPU) and reports it (reason "hung"); the operator restarts in place (lastRestart reason Hang,
# detector agent, rank 1, detectSeconds <= 3; the restart seen within 4 s of the stop); both ranks restore from memory
# the last step generation 1 reached (at most 1 step lost) and the job ends Succeeded with restarts 1.
# Job 2: the same with the stopped rule off (RAILYARD_HANG_STOPPED_SECONDS=0): rank 1's SIGSTOP leaves both ranks
# without a step and without CPU (rank 0 blocks in the gradient exchange), and the stall rule finds it: Hang, detector
# agent, the evidence "no step for", detectSeconds <= 3 (max(3 s, 3 x the step time), steps here are well under 1 s).
# Job 3: pod 1 frozen whole (agent included): the rendezvous service finds it silent (issue 44 item 1, a node or pod
# that vanishes without closing its sockets), and the operator replaces it on another node at once.
set -euo pipefail
job_name=agenthang
job_memory=1
job_val_every=10
job_ckpt_sync=1
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
steps=300
# at_step N: rank 0 logged step N or later.
at_step() { [ "$(steps_of "$job_name-worker-0" | tail -1 | cut -d' ' -f1)" -ge "$1" ] 2>/dev/null; }

# hang_restart T_STOP RULE_TEXT RANKS: waits for the restart, checks lastRestart (a Hang of one of RANKS, a JSON array,
# whose message holds RULE_TEXT) and prints the times.
hang_restart() {
  wait_for 30 "the restart" bash -c "[ \"\$(kubectl get tj $job_name -n $ns -o jsonpath='{.status.restarts}')\" -ge 1 ]"
  local t_seen last
  t_seen=$(date +%s.%N)
  last=$(jp '{.status.lastRestart}')
  jq -e --arg text "$2" --argjson ranks "$3" '.reason == "Hang" and .symptom == "Hang" and .detector == "agent" and
    (.rank as $r | $ranks | index($r) != null) and
    .generation == 2 and .detectSeconds <= 3 and (.message | contains($text))' <<<"$last" >/dev/null ||
    fail "status.lastRestart is not the agent's Hang of rank $3 ($2) found within 3 s: $last"
  python3 -c "import sys; d = float(sys.argv[2]) - float(sys.argv[1]); print(f'SIGSTOP -> restart seen by the test in {d:.1f} s'); sys.exit(0 if d <= 4 else 1)" \
    "$1" "$t_seen" || fail "the restart came more than 4 s after the SIGSTOP"
  echo "lastRestart: $last"
}

# --- Job 1: pauses are not hangs; a stopped rank is found by its agent -----------------------------------------
start_two_replica_job "$steps"
# Past a few validations and synchronous saves, and the pause marks in the progress files.
wait_for 120 "step 60" at_step 60
[ "$(grep -c 'validation' "$(pod_log "$job_name-worker-0")")" -ge 3 ] || fail "no validation passes in rank 0's log"
[ "$(jp '{.status.restarts}')" = 0 ] || fail "a restart before any fault: $(jp '{.status.lastRestart}')"
stop_rank1_trainer
echo "SIGSTOP rank 1's trainer (pid $tp) at step $(steps_of "$job_name-worker-0" | tail -1 | cut -d' ' -f1)"
hang_restart "$t_stop" "process stopped (state T" "[1]"
grep -q '"rank hung"\|rank hung' "$(pod_log "$job_name-worker-1")" || fail "pod 1's agent did not log the hang"
# In place: the same pods; both ranks restore from memory the step generation 1 reached.
# (At most one step lost: the stopped trainer is continued to save on SIGTERM and may finish the step it was in.)
check_resumed 1
[ "$(restored_from "$job_name-worker-0")" = memory ] || fail "rank 0 restored from $(restored_from "$job_name-worker-0"), want memory"
[ "$(pod_uid "$job_name-worker-0")" = "$uid0" ] && [ "$(pod_uid "$job_name-worker-1")" = "$uid1" ] ||
  fail "a pod was re-created: the restart is in place"
wait_succeeded 180
[ "$(jp '{.status.restarts}')" = 1 ] || fail "restarts $(jp '{.status.restarts}'), want 1 (pauses after the restart were taken for hangs?)"
echo "job 1: ok (restored step $r from memory, generation 1 reached $gen1_last: $lost steps lost)"

# --- Job 2: the stall rule (stopped rule off) ------------------------------------------------------------------
kubectl delete tj "$job_name" -n "$ns" --wait=false >/dev/null
job_name=agentstall
job_hang_stopped=0 job_yaml "$job_name" 2 "$steps" | kubectl apply -n "$ns" -f - >/dev/null
wait_for 90 "job 2 to run" phase_is Running
wait_for 120 "job 2 at step 30" at_step 30
stop_rank1_trainer
# Both ranks stall (rank 1 stopped, rank 0 blocked on it) and both agents report: the first report names the rank.
hang_restart "$t_stop" "no step for" "[0, 1]"

# --- Job 3: a pod frozen whole (its agent too): the rendezvous service finds it silent ----------------------------
# SIGSTOP of pod 1's whole process group (agent and trainer; its node is fine): its sockets stay open, so rank 0 blocks
# in the gradient exchange with no error, and pod 1's agent sends nothing more. The service hears pod 0's agent and not
# pod 1's: after --agent-silence-seconds (4 by default) it reports pod 1 silent; the operator restarts (lastRestart
# AgentSilent, detector rendezvous, symptom Silent, detectSeconds from when pod 1 was last heard), deletes pod 1 with
# force and creates its replacement on another node (the frozen one is suspect for a while). The agents' own hang
# rules are off in this job, so the silence is what finds it (with them on, pod 0's agent reports its rank blocked
# first and the silent pod is replaced into that restart's generation: operator_unit_tests lifecycle).
kubectl delete tj "$job_name" -n "$ns" --wait=false >/dev/null
job_name=agentsilent
job_agent_hang=off job_yaml "$job_name" 2 "$steps" | kubectl apply -n "$ns" -f - >/dev/null
wait_for 90 "job 3 to run" phase_is Running
wait_for 120 "job 3 at step 30" at_step 30
uid1=$(pod_uid "$job_name-worker-1")
node1=$(pod_node "$job_name-worker-1")
agent_ctl freeze "$ns/$job_name-worker-1" >/dev/null
t_stop=$(date +%s.%N)
echo "froze pod $job_name-worker-1 (agent and trainer, node $node1) at step $(steps_of "$job_name-worker-0" | tail -1 | cut -d' ' -f1)"
wait_for 30 "the restart" bash -c "[ \"\$(kubectl get tj $job_name -n $ns -o jsonpath='{.status.restarts}')\" -ge 1 ]"
t_seen=$(date +%s.%N)
last=$(jp '{.status.lastRestart}')
jq -e --arg pod "$job_name-worker-1" --arg node "$node1" '.reason == "AgentSilent" and .symptom == "Silent" and
  .detector == "rendezvous" and .pod == $pod and .node == $node and .detectSeconds >= 3.5 and .detectSeconds <= 6 and
  (.message | contains("fell silent"))' <<<"$last" >/dev/null ||
  fail "status.lastRestart is not pod 1's silence found in 4-6 s: $last"
python3 -c "import sys; d = float(sys.argv[2]) - float(sys.argv[1]); print(f'freeze -> restart seen by the test in {d:.1f} s'); sys.exit(0 if d <= 7 else 1)" \
  "$t_stop" "$t_seen" || fail "the restart came more than 7 s after the freeze"
replaced() {
  u=$(pod_uid "$job_name-worker-1") && [ -n "$u" ] && [ "$u" != "$uid1" ] && n=$(pod_node "$job_name-worker-1") &&
    [ -n "$n" ] && [ "$n" != "$node1" ]
}
wait_for 30 "pod 1's replacement on another node" replaced
echo "pod 1 replaced on node $(pod_node "$job_name-worker-1") $(python3 -c "import sys, time; print(f'{time.time() - float(sys.argv[1]):.1f}')" "$t_stop") s after the freeze"
wait_succeeded 240
[ "$(jp '{.status.restarts}')" = 1 ] || fail "restarts $(jp '{.status.restarts}'), want 1 for one frozen pod"
echo "lastRestart: $last"
echo "agent hang e2e: ok (a stopped rank found by its agent, restored in place from memory with $lost steps lost; a blocked world found by the stall rule; a frozen pod found silent and replaced on another node)"
