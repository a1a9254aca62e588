#!/usr/bin/env bash
# The main job on the local cluster: builds Railyard, brings up a local Kubernetes control plane with simulated GPU
# nodes, prepares a small text corpus, starts the operator and trains the tiny example TrainingJob on those nodes
# (operator -> gang-bound pod -> agent -> rendezvous -> railyard-worker), showing `kubectl get tj` as it moves; then
# runs a 2-replica data-parallel job, kills one trainer process (kill -9) in the middle, shows the in-place recovery
# (new generation, same pods, restore from the in-memory tier: no step redone) and ends with the loss curve and the
# time lost.
# Not shown yet: the monitor and Prometheus (hang/straggler detection), node loss (see tests/e2e/elastic).
# Environment: RAILYARD_STATE_DIR (default ~/.local/state/railyard/demo), DEMO_STEPS (default 200),
# DEMO_FT_STEPS (steps of the fault-tolerance job, default 300), DEMO_BUILD_DIR (default build),
# DEMO_SKIP_BUILD=1 (use the binaries in DEMO_BUILD_DIR/bin as they are).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
state=${RAILYARD_STATE_DIR:-$HOME/.local/state/railyard/demo}
steps=${DEMO_STEPS:-200}
step() { printf '\n== %s\n' "$*"; }

ft_steps=${DEMO_FT_STEPS:-300}
build=$(realpath -m "${DEMO_BUILD_DIR:-build}")
if [ "${DEMO_SKIP_BUILD:-0}" != 1 ]; then
  step "install what is missing and build"
  bash scripts/install-deps.sh
  export CCACHE_BASEDIR=$root
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j2 --target railyard-node-agent railyard-worker railyard railyard-operator >/dev/null
fi

step "local cluster (state in $state)"
topology=deploy/local/topologies/h100-8node.yaml
bash deploy/local/cluster.sh up --state-dir "$state" --topology "$topology" --node-agent "$build/bin/railyard-node-agent"
eval "$(bash deploy/local/cluster.sh env --state-dir "$state")"
kubectl get nodes -L railyard.dev/unit,railyard.dev/leaf,railyard.dev/gpu-type,railyard.dev/rails

step "prepare a text corpus into token shards"
data=$state/demo-data
"$build"/bin/railyard data prepare --force --input /usr/share/common-licenses/* --output "$data"

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
"$build"/bin/railyard-operator --leader-elect=false --worker-command "$build/bin/railyard-worker" \
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
[ "$phase" = Succeeded ] || { echo "the tiny job ended '$phase': see $state/operator.log and the worker's log"; exit 1; }

step "fault tolerance: a 2-replica job, one trainer killed with kill -9 in the middle"
# Same model and data, two pods (data parallel, dp=2), a checkpoint every 10 steps.
ft=tiny-ft
kubectl delete trainingjobs.railyard.dev $ft --ignore-not-found --wait=true >/dev/null
rm -rf "$state/ckpt/$ft"
sed -e "s|/tmp/railyard-data/|$data/|g" -e "s|/tmp/railyard-ckpt/tiny|$state/ckpt/$ft|" -e "s|name: tiny|name: $ft|" \
  -e "s|replicas: 1|replicas: 2|" -e "s|steps: 200|steps: $ft_steps|" -e "s|intervalSteps: 50|intervalSteps: 10|" \
  deploy/examples/tiny.yaml | kubectl apply -f -
ftj() { kubectl get trainingjobs.railyard.dev $ft -o jsonpath="$1" 2>/dev/null; }
for _ in $(seq 1 300); do [ "$(ftj '{.status.step}')" -ge $((ft_steps / 3)) ] 2>/dev/null && break; sleep 0.5; done
kubectl get trainingjobs.railyard.dev $ft
uids_before=$(kubectl get pods -l railyard.dev/job=$ft -o jsonpath='{.items[*].metadata.uid}')
uid1=$(kubectl get pod $ft-worker-1 -o jsonpath='{.metadata.uid}')
# The pod's process is its agent; the trainer is the agent's child.
agent_pid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]]["pid"])' \
  "$state/node-agent/processes.json" "$uid1")
worker_pid=$(pgrep -P "$agent_pid" | head -1)
echo "kill -9 $worker_pid (rank 1's trainer in pod $ft-worker-1) (status: step $(ftj '{.status.step}'), reported every 5 s), last checkpoint $(cat "$state/ckpt/$ft/latest" 2>/dev/null)"
kill -9 "$worker_pid"
last_key=""
uids_after=""
for i in $(seq 1 1200); do
  ftphase=$(ftj '{.status.phase}')
  line=$(kubectl get trainingjobs.railyard.dev $ft --no-headers 2>/dev/null || true)
  key="$ftphase $(ftj '{.status.restarts}') $(ftj '{.status.generation}')"
  # A line when phase, restarts or generation change, and every few polls in between (the progress column moves).
  if [ "$key" != "$last_key" ] || [ $((i % 3)) = 0 ]; then echo "$line"; last_key=$key; fi
  if [ -z "$uids_after" ] && [ "$ftphase" = Running ] && [ "$(ftj '{.status.restarts}')" = 1 ]; then
    uids_after=$(kubectl get pods -l railyard.dev/job=$ft -o jsonpath='{.items[*].metadata.uid}')
  fi
  case "$ftphase" in Succeeded | Failed | Invalid) break ;; esac
  sleep 0.2
done
kubectl get trainingjobs.railyard.dev $ft -o wide
echo "last restart: $(ftj '{.status.lastRestart.reason}'): $(ftj '{.status.lastRestart.message}') (detector $(ftj '{.status.lastRestart.detector}'))"
if [ "$uids_after" = "$uids_before" ]; then
  echo "no pod was re-created: the agents restarted their trainers in place (pod UIDs $uids_before)"
else
  echo "pod UIDs before the kill: $uids_before; in the new generation: ${uids_after:-not seen}"
fi

step "loss curve and time lost"
python3 - "$state/node-agent/pods/default_$ft-worker-0/worker.log" "$state/node-agent/pods/default_$ft-worker-1/worker.log" \
  "$ftphase" "$(ftj '{.status.restarts}')" <<'PY'
import re, sys
from datetime import datetime
log0, log1 = (open(p).read().splitlines() for p in sys.argv[1:3])
phase, restarts = sys.argv[3], sys.argv[4]
ts = lambda l: datetime.strptime(l[:23], "%Y-%m-%dT%H:%M:%S.%f").timestamp()
step_re = re.compile(r"worker: step step=(\d+)/(\d+) loss=([0-9.]+).* step_ms=([0-9.]+)")
# The log holds every generation; the last run of each step is the one that counts.
runs, final = [], {}
for l in log0:
    m = step_re.search(l)
    if m:
        runs.append((int(m.group(1)), float(m.group(3)), float(m.group(4)), ts(l)))
        final[int(m.group(1))] = float(m.group(3))
steps = sorted(final)
if not steps:
    sys.exit("no steps in the log")
print("step   loss")
lo, hi = min(final.values()), max(final.values())
shown = steps[:: max(1, len(steps) // 20)]
for s in shown + ([steps[-1]] if shown[-1] != steps[-1] else []):
    bar = "#" * (1 + int(50 * (final[s] - lo) / max(hi - lo, 1e-9)))
    print(f"{s:5d}  {final[s]:.4f} {bar}")
exits = [ts(l) for l in log1 if "agent: worker exited generation=1" in l]
restored = [(i, int(re.search(r" step=(\d+)", l).group(1))) for i, l in enumerate(log0) if "checkpoint: restored " in l]
redone = len(runs) - len(final)
mean_ms = sum(r[2] for r in runs) / len(runs)
print(f"\nsteps {steps[-1]}, final loss {final[steps[-1]]:.4f}, job {phase}, restarts {restarts}, failures injected 1")
if exits and restored:
    i, r = restored[-1]
    first = next(ts(l) for l in log0[i:] if step_re.search(l))
    print(f"restored step {r}; steps redone {redone}; from the kill to the first step of the new generation "
          f"{first - exits[0]:.2f} s; time lost {first - exits[0] + redone * mean_ms / 1e3:.2f} s "
          f"(that plus {redone} redone steps x {mean_ms:.0f} ms)")
PY
kubectl get trainingjobs.railyard.dev $ft -o json >"$state/$ft.json"
"$build/bin/railyard" report --log "$state/node-agent/pods/default_$ft-worker-0/worker.log" --status "$state/$ft.json" \
  --checkpoints "$state/ckpt/$ft" --output "$state/$ft-report.html" | sed 's/^report: wrote /HTML report (loss curve, restarts, checkpoints): /'
echo
echo "The cluster and the operator keep running. Use them with:  eval \"\$(deploy/local/cluster.sh env --state-dir $state)\""
echo "Stop them with:  kill \$(cat $state/operator.pid); deploy/local/cluster.sh down --state-dir $state"
[ "$phase" = Succeeded ]
