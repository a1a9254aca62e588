# shellcheck shell=bash
# job_manifest NAME [key=value ...]: the TrainingJob most e2e tests submit, printed as YAML: the tiny model on data
# that is never read (the pods run a shell command instead of the trainer), 10 steps. One home for the manifest the
# operator, agent, terminal, scheduler and chaos tests each used to paste.
#   replicas=N (1)  procs=N (1)  device=cpu|cuda (cpu)  maxRestarts=N (1)  globalBatch=N (12)
#   command=SCRIPT  the pod runs `sh -c SCRIPT` in place of the agent (what the operator sees without the agent)
#   agent=SCRIPT    the pod runs the agent, which runs `sh -c SCRIPT` as its worker command
#   env='{name: A, value: b}, ...'  the worker container's env (a YAML flow sequence's items)
#   extra=YAML      more lines under spec (indented two spaces)
job_manifest() {
  local name=$1 replicas=1 procs=1 device=cpu maxRestarts=1 globalBatch=12 command="" agent="" env="" extra="" kv
  shift
  for kv in "$@"; do
    case "$kv" in
      replicas=* | procs=* | device=* | maxRestarts=* | globalBatch=* | command=* | agent=* | env=* | extra=*)
        local "$kv" ;;
      *) echo "job_manifest: unknown option '$kv'" >&2 && return 2 ;;
    esac
  done
  local container
  if [ -n "$agent" ]; then
    container="- args: [\"agent\", \"--\", \"sh\", \"-c\", \"$agent\"]"
  else
    container="- command: [\"sh\", \"-c\", \"$command\"]"
  fi
  [ -n "$env" ] && container+=$'\n'"          env: [$env]"
  cat <<YAML
apiVersion: railyard.dev/v1alpha1
kind: TrainingJob
metadata: {name: $name}
spec:
  replicas: $replicas
  procsPerReplica: $procs
  device: $device
  model: {preset: tiny}
  data: {train: /tmp/none/train_*.bin}
  training: {steps: 10, globalBatch: $globalBatch, microBatch: 1}
  failurePolicy: {maxRestarts: $maxRestarts}
  template:
    spec:
      containers:
        $container
${extra}
YAML
}
