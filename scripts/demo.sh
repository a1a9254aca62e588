#!/usr/bin/env bash
# The main job on the local cluster: builds Railyard, brings up a local Kubernetes control plane with simulated GPU
# nodes, prepares a small text corpus, starts the operator and trains the tiny example TrainingJob on those nodes
# (operator -> gang-bound pod -> agent -> rendezvous -> railyard-worker), showing `kubectl get tj` as it moves.
# It grows into the full demo (failure injection, recovery, Prometheus) as those pieces land.
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
cmake --build build -j2 --target railyard-node-agent railyard-worker railyard railyard-operator >/dev/null

step "local cluster (state in $state)"
topology=deploy/local/topologies/h100-8node.yaml
bash deploy/local/cluster.sh up --state-dir "$state" --topology "$topology" --node-agent "$root/build/bin/railyard-node-agent"
eval "$(bash deploy/local/cluster.sh env --state-dir "$state")"
kubectl get nodes -L railyard.dev/unit,railyard.dev/leaf,railyard.dev/gpu-type,railyard.dev/rails

step "prepare a text corpus into token shards"
data=$state/demo-data
build/bin/railyard data prepare --force --input /usr/share/common-licenses/* --output "$data"

step "install the TrainingJob CRD and start the operator"
kubectl apply -f deploy/crds/trainingjobs.railyard.dev.yaml >/dev/null
kubectl wait --for=condition=Established --timeout=60s crd/trainingjobs.railyard.dev >/dev/null 2>&1
# One operator per demo state dir, stopped by pid (and only if that pid is still our operator).
if [ -f "$state/operator.pid" ]; then
  old=$(cat "$state/operator.pid")
  if tr '\0' ' ' <"/proc/$old/cmdline" 2>/dev/null | grep -q "railyard-operator.*--rendezvous-bind"; then
    kill "$old" 2>/dev/null || true
  fi
fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
build/bin/railyard-operator --leader-elect=false --worker-command "$root/build/bin/railyard-worker" \
  --metrics-addr "127.0.0.1:$(free_port)" --health-addr "127.0.0.1:$(free_port)" --rendezvous-bind 127.0.0.1:0 \
  >"$state/operator.log" 2>&1 &
echo $! >"$state/operator.pid"
echo "operator pid $(cat "$state/operator.pid"), log $state/operator.log"

step "train the tiny example as a TrainingJob"
# (Full resource name: a kubectl discovery cache from before the CRD existed may not know the short name tj yet.)
kubectl delete trainingjobs.railyard.dev tiny --ignore-not-found --wait=true >/dev/null
sed -e "s|/tmp/railyard-data/|$data/|g" -e "s|/tmp/railyard-ckpt/tiny|$state/ckpt/tiny|" deploy/examples/tiny.yaml |
  sed -e "s|steps: 200|steps: $steps|" | kubectl apply -f -
phase=""
last=""
for _ in $(seq 1 600); do
  phase=$(kubectl get trainingjobs.railyard.dev tiny -o jsonpath='{.status.phase}')
  line=$(kubectl get trainingjobs.railyard.dev tiny --no-headers 2>/dev/null || true)
  [ "$line" != "$last" ] && echo "$line" && last=$line
  case "$phase" in Succeeded | Failed | Invalid) break ;; esac
  sleep 1
done
kubectl get trainingjobs.railyard.dev tiny -o wide
kubectl describe trainingjobs.railyard.dev tiny | sed -n '/^Events:/,$p'
log=$(ls "$state"/node-agent/pods/default_tiny-worker-0/*.log 2>/dev/null | head -1 || true)
[ -n "$log" ] && { echo "last lines of the worker's log ($log):"; grep -E "step=|validation" "$log" | tail -n 5; }
echo
echo "The cluster and the operator keep running. Use them with:  eval \"\$(deploy/local/cluster.sh env --state-dir $state)\""
echo "Stop them with:  kill \$(cat $state/operator.pid); deploy/local/cluster.sh down --state-dir $state"
[ "$phase" = Succeeded ]
