# shellcheck shell=bash
# Shared set-up of the elastic e2e scripts (sourced after `set -euo pipefail`): the local cluster's env, a namespace,
# tiny shards, the operator with the worker agent, and helpers to read the job and its pods. Each script sets
# `job_name` before sourcing and may set `op_extra` (more operator flags).
job_name=${job_name:?set job_name before sourcing lib.sh}
src=${RAILYARD_SOURCE_DIR:?}
state=${RAILYARD_E2E_STATE_DIR:?}
bin=${RAILYARD_BIN_DIR:?}
for b in railyard railyard-operator railyard-worker railyard-node-agent; do
  [ -x "$bin/$b" ] || { echo "FAIL: no $b in $bin (build it first)" >&2; exit 1; }
done
eval "$(bash "$src/deploy/local/cluster.sh" env --state-dir "$state")"
ns=${ns:-elastic-e2e-$$}
work=$(mktemp -d /tmp/elastic-e2e.XXXXXX)
op_pid=""
nodes_down=()
# shellcheck source=../operator/lib.sh
source "$src/tests/e2e/operator/lib.sh"

fail() {
  echo "FAIL: $*" >&2
  kubectl get tj,pods -n "$ns" -o wide >&2 || true
  kubectl get tj "$job_name" -n "$ns" -o jsonpath='{.status}' >&2 || true
  echo >&2
  tail -n 30 "$work/op.log" >&2
  for f in "$state"/node-agent/pods/"${ns}"_*/*.log; do [ -f "$f" ] && { echo "== $f" >&2; tail -n 15 "$f" >&2; }; done
  exit 1
}
cleanup() {
  for n in "${nodes_down[@]}"; do agent_ctl node-up "$n" >/dev/null 2>&1 || true; done
  [ -n "$op_pid" ] && kill "$op_pid" 2>/dev/null && wait "$op_pid" 2>/dev/null || true
  # Pods still running (a failed run) are killed before $work goes, or their trainers re-create it when they save.
  kubectl delete pods --all -n "$ns" --grace-period=0 --force --wait=true --timeout=30s >/dev/null 2>&1 || true
  # A force-deleted pod's agent is killed before it can remove its in-memory checkpoint segments (docs/checkpointing.md).
  rm -f /dev/shm/railyard-"${ns}"_* 2>/dev/null || true
  kubectl delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

agent_ctl() { "$bin/railyard-node-agent" "$@" --state-dir "$state/node-agent"; }
jp() { kubectl get tj "$job_name" -n "$ns" -o jsonpath="$1" 2>/dev/null; }
phase_is() { [ "$(jp '{.status.phase}')" = "$1" ]; }
restarts_is() { [ "$(jp '{.status.restarts}')" = "$1" ]; }
world_is() { [ "$(jp '{.status.world.size}')" = "$1" ] && phase_is Running; }
pod_uid() { kubectl get pod "$1" -n "$ns" -o jsonpath='{.metadata.uid}' 2>/dev/null; }
pod_node() { kubectl get pod "$1" -n "$ns" -o jsonpath='{.spec.nodeName}' 2>/dev/null; }
pod_log() { echo "$state/node-agent/pods/${ns}_$1/worker.log"; }
# trainer_pid POD: the trainer process of the pod (the pod's process is its agent; the trainer is the agent's child,
# in a process group of its own), or nothing.
trainer_pid() {
  local agent
  agent=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], {}).get("pid", ""))' \
    "$state/node-agent/processes.json" "$(pod_uid "$1")" 2>/dev/null) || return 0
  [ -n "$agent" ] && pgrep -P "$agent" | head -1
  true
}
# The newest committed checkpoint step (the `latest` pointer, "step-%08d"), or -1.
latest_step() {
  local t
  t=$(cat "$work/ckpt/$job_name/latest" 2>/dev/null) || { echo -1; return; }
  echo $((10#${t#step-}))
}
latest_at_least() { [ "$(latest_step)" -ge "$1" ]; }
# Steps the pod's log reports, one "STEP LOSS" line per step in order (all generations, the log is appended).
steps_of() { grep -oE 'worker: step step=[0-9]+/[0-9]+ loss=[0-9.]+' "$(pod_log "$1")" | sed -E 's/.*step=([0-9]+)\/[0-9]+ loss=/\1 /'; }
# The step restored by the last "restored" line of the pod's log, and where from ("memory" or the step directory).
restored_from() { grep 'checkpoint: restored ' "$(pod_log "$1")" | tail -1 | grep -oE ' from=[^ ]+' | cut -d= -f2; }
restored_step() { grep 'checkpoint: restored ' "$(pod_log "$1")" | tail -1 | grep -oE ' step=[0-9]+' | cut -d= -f2; }

# job_yaml NAME REPLICAS STEPS [MIN_REPLICAS] [NODE_SELECTOR_UNIT]: the tiny model, dp = replicas, checkpoint every
# 5 steps, global batch 8 sequences (accumulation 2 at dp=2, 4 at dp=1); `job_memory=N` adds the in-memory tier
# (spec.checkpoint.memoryIntervalSteps).
job_yaml() {
  cat <<YAML
apiVersion: railyard.dev/v1alpha1
kind: TrainingJob
metadata: {name: $1}
spec:
  replicas: $2
  procsPerReplica: 1
  device: cpu
  model: {preset: tiny}
  data: {train: $work/data/train_*.bin}
  training: {steps: $3, globalBatch: 8, microBatch: 2, seqLen: 64, learningRate: 0.001, warmupSteps: 5}
  checkpoint: {path: $work/ckpt/$1, intervalSteps: 5${job_memory:+, memoryIntervalSteps: $job_memory}}
  failurePolicy: {maxRestarts: 3}
YAML
  [ -n "${4:-}" ] && echo "  elastic: {minReplicas: $4, maxReplicas: $2}"
  [ -n "${5:-}" ] && echo "  placement: {nodeSelector: {railyard.dev/unit: $5}}"
  true
}

# reference_loss STEPS: runs the same job undisturbed (name "$job_name-ref") to the end and prints its last step's
# loss as logged (6 decimals): a resumed run must end on the same number (restore is bitwise, docs/checkpointing.md).
reference_loss() {
  local ref=$job_name-ref t0=$SECONDS phase
  job_yaml "$ref" 2 "$1" | kubectl apply -n "$ns" -f - >/dev/null
  while :; do
    phase=$(kubectl get tj "$ref" -n "$ns" -o jsonpath='{.status.phase}' 2>/dev/null)
    [ "$phase" = Succeeded ] && break
    case "$phase" in Failed | Invalid) fail "the undisturbed reference job ended $phase" ;; esac
    [ $((SECONDS - t0)) -lt 120 ] || fail "the undisturbed reference job did not finish in 120 s"
    sleep 0.5
  done
  [ "$(kubectl get tj "$ref" -n "$ns" -o jsonpath='{.status.restarts}')" = 0 ] || fail "the reference job restarted"
  steps_of "$ref-worker-0" | tail -1 | cut -d' ' -f2
}

start_operator() {
  "$bin/railyard" data prepare --input /usr/share/common-licenses/* --output "$work/data" >/dev/null
  install_crd "$src"
  kubectl create namespace "$ns" >/dev/null
  wait_for 60 "the default service account token" \
    bash -c "kubectl get sa default -n $ns -o jsonpath='{.secrets[0].name}' | grep -q ."
  # shellcheck disable=SC2086
  "$bin/railyard-operator" --namespace "$ns" --leader-elect=false --worker-command "$bin/railyard-worker" \
    --metrics-addr "127.0.0.1:$(free_port)" --health-addr "127.0.0.1:$(free_port)" --rendezvous-bind 127.0.0.1:0 \
    ${op_extra:-} >"$work/op.log" 2>&1 &
  op_pid=$!
  wait_for 30 "the operator to start" grep -q "leading: reconciling" "$work/op.log"
}

# wait_succeeded SECONDS: until the job is Succeeded (fails at once on Failed/Invalid).
wait_succeeded() {
  local t0=$SECONDS phase
  while :; do
    phase=$(jp '{.status.phase}')
    case "$phase" in Succeeded) return 0 ;; Failed | Invalid) fail "job ended $phase: $(jp '{.status.conditions}')" ;; esac
    [ $((SECONDS - t0)) -lt "$1" ] || fail "not Succeeded after $1 s (phase '$phase')"
    sleep 0.5
  done
}
