#!/usr/bin/env bash
# E2E flow 3 (issue #10): shrink and grow. An elastic job (replicas 2, minReplicas 1) is confined to the two nodes
# of unit u0 (placement.nodeSelector), so losing one leaves no spare. Taking the node of pod 1 down (node agent
# fault injection: lease and heartbeats stop, processes killed) makes the operator shrink the world to 1 in a new
# generation that restores the newest checkpoint and keeps training with the same global batch (gradient
# accumulation); bringing the node back grows the world to 2 again, and the job ends Succeeded. The job runs in
# deterministic mode (spec.parallelism.deterministic), so its final parameters after 2 -> 1 -> 2 are bitwise those of
# an undisturbed run.
set -euo pipefail
job_name=resize
job_deterministic=1
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
steps=300
start_operator
job_yaml "$job_name" 2 "$steps" 1 u0 | kubectl apply -n "$ns" -f - >/dev/null
wait_for 90 "the job to run with 2 replicas" world_is 2
wait_for 90 "a first checkpoint" latest_at_least 10
node1=$(pod_node "$job_name-worker-1")
[ -n "$node1" ] || fail "pod 1 has no node"
log0=$(pod_log "$job_name-worker-0")
t_down=$(date +%s.%N)
agent_ctl node-down "$node1" >/dev/null
nodes_down+=("$node1")
echo "node $node1 (pod 1) down at checkpoint step $(latest_step)"
wait_for 60 "the world to shrink to 1" world_is 1
t_shrunk=$(date +%s.%N)
gen_small=$(jp '{.status.generation}')
[ "$(jp '{.status.world.pods[0]}')" = "$job_name-worker-0" ] || fail "world after the shrink: $(jp '{.status.world.pods}')"
# Generation gen_small: rank 0 restores the newest checkpoint and trains on alone with the same global batch.
restores() { grep -c 'checkpoint: restored ' "$log0" || true; }
wait_for 60 "rank 0 to restore in the shrunk world" bash -c "[ \$(grep -c 'checkpoint: restored ' '$log0') -ge 1 ]"
r=$(restored_step "$job_name-worker-0")
[ "$r" -gt 0 ] || fail "the shrunk world restored step $r (a fresh start)"
n_at_shrink=$(restores)
progress_past() { [ "$(jp '{.status.step}')" -ge "$1" ]; }
wait_for 60 "the shrunk world to train 10 steps" progress_past $((r + 10))
grep 'worker: training ' "$log0" | tail -1 | grep -q 'global_batch_tokens=512' ||
  fail "global batch changed in the shrunk world: $(grep 'worker: training ' "$log0" | tail -1)"
joined() { grep 'agent: joined generation=' "$log0" | tail -1; }
joined | grep -q "generation=$gen_small world_size=1 " || fail "rank 0's agent did not join generation $gen_small alone: $(joined)"
echo "shrunk to 1 replica in generation $gen_small, restored step $r, trained on to step $(jp '{.status.step}')"

t_up=$(date +%s.%N)
agent_ctl node-up "$node1" >/dev/null
nodes_down=()
wait_for 90 "the world to grow back to 2" world_is 2
t_grown=$(date +%s.%N)
gen_big=$(jp '{.status.generation}')
[ "$gen_big" -gt "$gen_small" ] || fail "grow did not open a new generation ($gen_small -> $gen_big)"
wait_for 60 "rank 0 to restore in the grown world" bash -c "[ \$(grep -c 'checkpoint: restored ' '$log0') -gt $n_at_shrink ]"
r2=$(restored_step "$job_name-worker-0")
[ "$r2" -gt "$r" ] || fail "the grown world restored step $r2, not later than the shrink's $r"
joined | grep -q "generation=$gen_big world_size=2 " || fail "rank 0's agent did not join generation $gen_big with 2: $(joined)"
grep 'worker: training ' "$log0" | tail -1 | grep -q 'global_batch_tokens=512' || fail "global batch changed after the grow"
wait_succeeded 240
[ "$(jp '{.status.progress}')" = "$steps/$steps" ] || fail "progress '$(jp '{.status.progress}')'"
# One node loss is one restart: the survivor's exit opens a generation, the lost pod (which never joined it) is
# replaced into it; the shrink and the grow are resizes, not restarts.
[ "$(jp '{.status.restarts}')" = 1 ] || fail "restarts $(jp '{.status.restarts}') for one node loss, want 1"
last=$(steps_of "$job_name-worker-0" | tail -1)
python3 -c "import sys; sys.exit(0 if 0 < float(sys.argv[1]) < 4.5 else 1)" "${last#* }" ||
  fail "final loss ${last#* } not below 4.5"
# Every generation trained in deterministic mode: dp=2, then dp=1 (accumulation 4), then dp=2 again.
gens=$(grep -oE 'data_parallel="dp=[0-9]+ zero=0[^"]*' "$log0" | cut -d'"' -f2)
! grep -qv ' deterministic ' <<<"$gens" || fail "a generation of rank 0 trained without deterministic mode: $gens"
dps=$(grep -oE '^dp=[0-9]+' <<<"$gens" | uniq | tr '\n' ' ')
[ "$dps" = "dp=2 dp=1 dp=2 " ] || fail "rank 0's data-parallel degrees over the generations: '$dps', want dp=2 dp=1 dp=2"
ref_loss=$(reference_params "$steps")
[ "${last#* }" = "$ref_loss" ] || fail "final loss ${last#* } differs from the undisturbed run's $ref_loss"
params_sha=$(final_params_match "$steps")
python3 - "$t_down" "$t_shrunk" "$t_up" "$t_grown" <<'PY'
import sys
d, s, u, g = map(float, sys.argv[1:])
print(f"resize: node down -> world 1 in {s - d:.1f} s; node up -> world 2 in {g - u:.1f} s")
PY
echo "shrink/grow e2e: ok (generations $gen_small and $gen_big, restored $r then $r2, restarts $(jp '{.status.restarts}'), final loss ${last#* }, final parameters bitwise the undisturbed run's, sha256 ${params_sha:0:16})"
