#!/usr/bin/env bash
# E2E flow 3a (issue #10): a worker hangs. A 2-replica data-parallel job (500 steps) trains the tiny model
# (deterministic mode, a checkpoint every 5 steps, the default failure policy: excludeFailedNodes true) while a real
# Prometheus scrapes both trainers and railyard-monitor reads them through it. Rank 1's trainer process gets SIGSTOP
# (its agent keeps running, as with a hung kernel): its /metrics goes with it and rank 0 waits in the gradient
# exchange. The monitor's stall rule requests a restart (Hang, rank 1, rank 1's node) and appends that node to
# railyard.dev/exclude-nodes; the operator records the request (RestartRequested, symptom Hang, detector monitor, rank
# 1) and, as the policy says (docs/scheduler.md "Failure exclusion"), moves pod 1 off the excluded node: a new pod
# (new UID) on another node, pod 0 re-joins in place. Both ranks restore the same checkpoint, at most one interval
# behind what generation 1 reached; the job ends Succeeded with the undisturbed run's final loss and bitwise its final
# parameters.
set -euo pipefail
job_name=hang
job_deterministic=1
# The monitor's stall rule is under test: the agent's own hang watch (which finds a stopped trainer in about 1 s) is
# off in this job (e2e_elastic_agent_hang tests it).
job_agent_hang=off
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
steps=500 # long enough to be caught mid-run when the machine is busy (200 finished in 14 s, before a loaded test found a trainer)
interval=5
start_operator
start_monitor_prometheus
job_yaml "$job_name" 2 "$steps" | kubectl apply -n "$ns" -f - >/dev/null
wait_monitored_run
stop_rank1_trainer
echo "SIGSTOP rank 1's trainer (pid $tp, node $node1) at step $(steps_of "$job_name-worker-0" | tail -1 | cut -d' ' -f1), checkpoint $(latest_step)"

# Detection: the monitor's request, through Prometheus (the monitor has no other source of worker metrics).
wait_for 40 "the monitor's restart request" has_restart_request
t_req=$(date +%s.%N)
req=$(restart_request)
echo "restart request: $req"
jq -e --arg node "$node1" '.reason == "Hang" and .rule == "stall" and .rank == 1 and .node == $node and
  .detector == "monitor" and .generation == 1 and (.evidence | test("rank 1"))' <<<"$req" >/dev/null ||
  fail "the request is not a Hang of rank 1 on $node1 by the monitor's stall rule in generation 1: $req"
grep -q '"msg":"restart requested"\|restart requested' "$work/mon.log" || fail "the monitor did not log its request"
excluded=$(kubectl get tj "$job_name" -n "$ns" -o json | jq -r '.metadata.annotations["railyard.dev/exclude-nodes"] // ""')
[ "$excluded" = "$node1" ] || fail "railyard.dev/exclude-nodes is '$excluded', want $node1 (excludeFailedNodes defaults to true)"

# The operator: one restart, attributed to the monitor's request, and pod 1 moved off the excluded node.
wait_for 30 "the restart" bash -c "[ \"\$(kubectl get tj $job_name -n $ns -o jsonpath='{.status.restarts}')\" -ge 1 ]"
last=$(jp '{.status.lastRestart}')
jq -e --arg node "$node1" '.reason == "RestartRequested" and .symptom == "Hang" and .detector == "monitor" and
  .rank == 1 and .node == $node and .detectSeconds > 0' <<<"$last" >/dev/null ||
  fail "status.lastRestart does not carry the monitor's Hang request: $last"
# The replacement: seen as a pod with a new UID, or (on a loaded machine the job may finish and its pods be cleaned up
# between two polls) in the operator's Bound event for it.
bound_event_node() {
  kubectl get events -n "$ns" --field-selector involvedObject.name="$job_name",reason=Bound -o json |
    jq -r --arg p "$job_name-worker-1" '[.items[].message | capture("bound 1 pods: " + $p + " -> (?<n>[^ ]+)").n] | last // ""'
}
new_pod() {
  local u
  u=$(pod_uid "$job_name-worker-1")
  if [ -n "$u" ] && [ "$u" != "$uid1" ] && [ -n "$(pod_node "$job_name-worker-1")" ]; then
    new_node1=$(pod_node "$job_name-worker-1") new_uid1=$u
  else
    new_node1=$(bound_event_node) new_uid1="(pod already cleaned up; from the Bound event)"
  fi
  [ -n "$new_node1" ]
}
new_node1="" new_uid1=""
wait_for 60 "a replacement pod 1, bound to a node" new_pod
[ "$new_node1" != "$node1" ] || fail "the replacement pod is on the excluded node $node1"
echo "pod 1 moved $node1 -> $new_node1 (new uid $new_uid1)"
[ -z "$(pod_uid "$job_name-worker-0")" ] || [ "$(pod_uid "$job_name-worker-0")" = "$uid0" ] ||
  fail "pod 0 was re-created, only pod 1's node is excluded"

# Restore: both ranks the same checkpoint, at most one interval behind generation 1's last step; next step follows.
check_resumed "$interval"
# Pod 0 re-joined in place: one agent ran in it all along (a re-created pod would start a second one).
[ "$(grep -c 'agent: starting ' "$(pod_log "$job_name-worker-0")")" = 1 ] || fail "pod 0's agent started more than once"

check_succeeded_as_undisturbed "$steps" 1
request_timing "hang: SIGSTOP" "status.lastRestart.detectSeconds $(jp '{.status.lastRestart.detectSeconds}')" \
  "$t_stop" "$t_req" "$t_step" "$req"
echo "hang e2e: ok (Hang of rank 1 by the monitor through Prometheus, node $node1 excluded, pod 1 moved to $new_node1; restored $r, generation 1 reached $gen1_last: $lost steps lost; final loss $final_loss, final parameters bitwise the undisturbed run's, sha256 ${params_sha:0:16})"
