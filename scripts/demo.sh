#!/usr/bin/env bash
# The main job on the local cluster: builds Railyard, brings up a local Kubernetes control plane with simulated GPU
# nodes, prepares a small text corpus, and trains a tiny GPT in a pod on one of those nodes, printing its log.
# It grows into the full TrainingJob demo (operator, failure injection, recovery) as those pieces land.
# Environment: RAILYARD_STATE_DIR (default ~/.local/state/railyard/demo), DEMO_STEPS (default 200).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
state=${RAILYARD_STATE_DIR:-$HOME/.local/state/railyard/demo}
steps=${DEMO_STEPS:-200}
step() { printf '\n== %s\n' "$*"; }

step "install what is missing and build"
bash scripts/install-deps.sh
export CCACHE_BASEDIR=$root
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j2 --target railyard-node-agent railyard-worker railyard >/dev/null

step "local cluster (state in $state)"
topology=deploy/local/topologies/h100-8node.yaml
bash deploy/local/cluster.sh up --state-dir "$state" --topology "$topology" --node-agent "$root/build/bin/railyard-node-agent"
eval "$(bash deploy/local/cluster.sh env --state-dir "$state")"
kubectl get nodes -L railyard.dev/unit,railyard.dev/leaf,railyard.dev/gpu-type,railyard.dev/rails

step "prepare a text corpus into token shards"
data=$state/demo-data
build/bin/railyard data prepare --force --input /usr/share/common-licenses/* --output "$data"

step "train a tiny GPT in a pod on a simulated node"
node=$(kubectl get nodes -l railyard.dev/simulated=true -o jsonpath='{.items[0].metadata.name}')
kubectl delete pod railyard-demo --ignore-not-found --wait=true >/dev/null
kubectl apply -f - <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: railyard-demo
  labels: {app.kubernetes.io/name: railyard-demo}
spec:
  nodeName: $node
  restartPolicy: Never
  containers:
    - name: worker
      image: railyard/worker:local
      command: ["$root/build/bin/railyard-worker", "train"]
      args: ["--model", "tiny", "--data", "$data", "--steps", "$steps", "--batch", "8", "--seq", "64",
             "--lr", "1e-3", "--warmup", "20", "--val-every", "50"]
      env:
        - {name: RAILYARD_NUM_THREADS, value: "2"}
        - name: NODE_NAME
          valueFrom: {fieldRef: {fieldPath: spec.nodeName}}
YAML
log=$state/node-agent/pods/default_railyard-demo/worker.log
printf 'waiting for the pod (log: %s)\n' "$log"
phase=""
for _ in $(seq 1 600); do
  phase=$(kubectl get pod railyard-demo -o jsonpath='{.status.phase}')
  case "$phase" in Succeeded | Failed) break ;; esac
  sleep 1
done
[ -f "$log" ] && tail -n 25 "$log"
kubectl get pod railyard-demo -o wide
echo "pod phase: $phase, exit code: $(kubectl get pod railyard-demo -o jsonpath='{.status.containerStatuses[0].state.terminated.exitCode}')"
echo
echo "The cluster keeps running. Use it with:  eval \"\$(deploy/local/cluster.sh env --state-dir $state)\""
echo "Stop it with:                           deploy/local/cluster.sh down --state-dir $state"
[ "$phase" = Succeeded ]
