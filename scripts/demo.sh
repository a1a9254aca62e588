#!/usr/bin/env bash
# The main job on the local cluster: builds Railyard, brings up a local Kubernetes control plane with simulated GPU
# nodes, prepares a small text corpus, starts the operator and trains the tiny example TrainingJob on those nodes
# (operator -> gang-bound pod -> agent -> rendezvous -> railyard-worker), showing `kubectl get tj` as it moves; then
# runs a 2-replica data-parallel job, kills one trainer process (kill -9) a quarter of the way in, shows the in-place
# recovery (new generation, same pods, restore from the in-memory tier: no step redone), then freezes a trainer
# (SIGSTOP, a hang) once the new generation runs: its pod's agent finds the process stopped within about a second and
# reports it, and the operator restarts the generation in place again (docs/rendezvous.md "Hangs the agent finds";
# railyard-monitor runs beside it for what an agent cannot see). Ends with the loss curve, the failures injected and
# the time lost. By default the nodes are real (3 kubelets + containerd, pods as containers of the worker image built
# here, data and checkpoints on the shared claim the examples mount: docs/local-cluster.md "Real nodes");
# `--simulated` uses 8 simulated nodes in 4 units (deploy/local/topologies/h100-8node.yaml) instead.
# Not shown: a straggler, node loss, shrink/grow (tests/e2e/elastic, tests/e2e/real).
# Environment: RAILYARD_STATE_DIR (default ~/.local/state/railyard/demo), DEMO_STEPS (default 200),
# DEMO_FT_STEPS (steps of the fault-tolerance job, default 1000: at 25-125 ms a step it must outlast both faults and
# their recoveries), DEMO_BUILD_DIR (default build),
# DEMO_SKIP_BUILD=1 (use the binaries in DEMO_BUILD_DIR/bin as they are).
set -euo pipefail
mode=real
for arg in "$@"; do
  case "$arg" in
    --simulated) mode=simulated ;;
    --real) mode=real ;;
    -h | --help)
      sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "demo.sh: unknown option '$arg' (known: --simulated, --real)" >&2
      exit 2
      ;;
  esac
done
cd "$(dirname "$0")/.."
root=$PWD
state=${RAILYARD_STATE_DIR:-$HOME/.local/state/railyard/demo}
steps=${DEMO_STEPS:-200}
step() { printf '\n== %s\n' "$*"; }

ft_steps=${DEMO_FT_STEPS:-1000}
build=$(realpath -m "${DEMO_BUILD_DIR:-build}")
if [ "${DEMO_SKIP_BUILD:-0}" != 1 ]; then
  step "install what is missing and build"
  bash scripts/install-deps.sh
  export CCACHE_BASEDIR=$root
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j2 --target railyard-node-agent railyard-worker railyard railyard-operator railyard-monitor \
    >/dev/null
fi

step "local cluster, $mode nodes (state in $state)"
if [ "$mode" = real ]; then
  RAILYARD_BUILD_DIR=$build bash deploy/local/cluster.sh up --state-dir "$state" --real-nodes 3 --prometheus
else
  topology=deploy/local/topologies/h100-8node.yaml
  bash deploy/local/cluster.sh up --state-dir "$state" --topology "$topology" \
    --node-agent "$build/bin/railyard-node-agent" --prometheus
fi
eval "$(bash deploy/local/cluster.sh env --state-dir "$state")"
[ -n "${PROMETHEUS_URL:-}" ] || { echo "no Prometheus on the demo cluster (cluster.sh env has no PROMETHEUS_URL)"; exit 1; }
kubectl get nodes -L railyard.dev/unit,railyard.dev/leaf,railyard.dev/gpu-type,railyard.dev/rails

step "prepare a text corpus into token shards"
if [ "$mode" = real ]; then
  # The examples' claim railyard-shared, mounted at /shared: data under data/, checkpoints under checkpoints/<job>.
  shared=$(bash deploy/local/cluster.sh share default --state-dir "$state")
  data=$shared/data
  ckpt_root=$shared/checkpoints
  # The examples' paths as they are, on the shared claim in place of a volume of each job's own (the demo prepares
  # the data once for all its jobs); only name, size and schedule change.
  job_yaml() { python3 tests/e2e/lib/example_on_claim.py /dev/stdin railyard-shared | sed -e "s|/shared/checkpoints/tiny|/shared/checkpoints/$1|"; }
else
  data=$state/demo-data
  ckpt_root=$state/ckpt
  job_yaml() { python3 tests/e2e/lib/example_on_claim.py /dev/stdin | sed -e "s|/shared/data/|$data/|g" -e "s|/shared/checkpoints/tiny|$ckpt_root/$1|"; }
fi
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
if [ "$mode" = real ]; then
  # Pods run the worker image and dial the rendezvous at the host's address on the pod network.
  op_pods=(--worker-image localhost/railyard/worker:0.1.0 --rendezvous-bind "$RAILYARD_POD_HOST_ADDR:0")
else
  op_pods=(--worker-command "$build/bin/railyard-worker" --rendezvous-bind 127.0.0.1:0)
fi
# The operator keeps its rendezvous CA in railyard-system (--rendezvous-ca-secret's default outside a cluster).
kubectl create namespace railyard-system --dry-run=client -o yaml | kubectl apply -f - >/dev/null
"$build"/bin/railyard-operator --leader-elect=false "${op_pods[@]}" \
  --metrics-addr "127.0.0.1:$(free_port)" --health-addr "127.0.0.1:$(free_port)" \
  >"$state/operator.log" 2>&1 &
echo $! >"$state/operator.pid"
echo "operator pid $(cat "$state/operator.pid"), log $state/operator.log"

step "start the monitor (railyard-monitor, reading the workers' metrics from Prometheus at $PROMETHEUS_URL)"
# Debian's Prometheus has no Kubernetes discovery: a loop rewrites its file-SD list from the worker pods every second
# (the relabelling of deploy/prometheus/prometheus.yml). Both run as long as the demo does (stopped by pid on exit).
mon_pid="" targets_pid=""
stop_demo_helpers() {
  [ -n "$mon_pid" ] && kill "$mon_pid" 2>/dev/null || true
  [ -n "$targets_pid" ] && kill "$targets_pid" 2>/dev/null || true
  [ -f "$state/stopped.pid" ] && signal_trainer CONT "$(cat "$state/stopped.pid")" 2>/dev/null || true
}
trap stop_demo_helpers EXIT
demo_pid=$$
(while kill -0 "$demo_pid" 2>/dev/null; do
  bash deploy/local/lib/prometheus.sh pod-targets "$state" workers >/dev/null 2>&1 || true
  sleep 1
done) &
targets_pid=$!
"$build"/bin/railyard-monitor --prometheus-url "$PROMETHEUS_URL" --listen 127.0.0.1:0 --interval 1 \
  >"$state/monitor.log" 2>&1 &
mon_pid=$!
echo "monitor pid $mon_pid, log $state/monitor.log"

step "train the tiny example as a TrainingJob"
# (Full resource name: a kubectl discovery cache from before the CRD existed may not know the short name tj yet.)
kubectl delete trainingjobs.railyard.dev tiny --ignore-not-found --wait=true >/dev/null
job_yaml tiny <deploy/examples/tiny.yaml | sed -e "s|steps: 200|steps: $steps|" | kubectl apply -f -
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
if [ "$mode" = simulated ]; then
  log=$(ls "$state"/node-agent/pods/default_tiny-worker-0/*.log 2>/dev/null | head -1 || true)
  [ -n "$log" ] && { echo "last lines of the worker's log ($log):"; grep -E "step=|validation" "$log" | tail -n 5; }
fi
[ "$phase" = Succeeded ] || { echo "the tiny job ended '$phase': see $state/operator.log and the worker's log"; exit 1; }

step "fault tolerance: a 2-replica job; kill -9 of one trainer at 1/4, then a hang of one trainer"
# Same model and data, two pods (data parallel, dp=2), a checkpoint every 10 steps. A quarter of the way in, rank 1's
# trainer gets kill -9 (its agent reports the exit: in-place restart, restore from the in-memory tier). Once the new
# generation trained 20 steps, rank 1's new trainer gets SIGSTOP (a hang: the process lives, its /metrics goes silent): its
# agent sees the process stopped and reports a Hang of rank 1, and the operator restarts the generation in place (a
# stopped process is not its node's fault: no node is excluded).
ft=tiny-ft
kubectl delete trainingjobs.railyard.dev $ft --ignore-not-found --wait=true >/dev/null
rm -rf "${ckpt_root:?}/$ft"
# cleanPodPolicy None: the pods (and so `kubectl logs`) stay after the job ends, for the summary below.
job_yaml $ft <deploy/examples/tiny.yaml | sed -e "s|name: tiny|name: $ft|" \
  -e "s|replicas: 1|replicas: 2|" -e "s|steps: 200|steps: $ft_steps|" -e "s|intervalSteps: 50|intervalSteps: 10|" \
  -e "s|^  failurePolicy:|  runPolicy:\n    cleanPodPolicy: None\n  failurePolicy:|" | kubectl apply -f -
ft_start=$(date +%s.%N) # the pods' logs are appended to by every run of the demo in this state dir
ftj() { kubectl get trainingjobs.railyard.dev $ft -o jsonpath="$1" 2>/dev/null || true; }
if [ "$mode" = real ]; then
  # A trainer is the process `railyard-worker train` in the pod's container; signals go in through kubectl exec
  # (same uid as the trainer). "pod/pid" names it.
  trainer_of() {
    kubectl exec "$1" -- sh -c 'for d in /proc/[0-9]*; do
      tr "\0" " " <"$d/cmdline" 2>/dev/null | grep -q "[r]ailyard-worker train" && { echo "${d#/proc/}"; break; }; done' |
      sed "s|^|$1/|" | grep /
  }
  signal_trainer() { kubectl exec "${2%/*}" -- sh -c "kill -$1 ${2#*/}"; }
  # Rank 0's log is its container's: copied every 10th poll and at the end (the pods stay after the job:
  # cleanPodPolicy None); status.step and the checkpoints tell the step in between.
  log0=$state/$ft-worker-0.log
  refresh_log0() {
    [ $((${i:-0} % 10)) = 0 ] || [ "${1:-}" = now ] || return 0
    kubectl logs "$ft-worker-0" >"$log0.tmp" 2>/dev/null && mv "$log0.tmp" "$log0" || true
  }
else
  # The trainer of a pod: the pod's process is its agent (node agent's processes.json); the trainer is its child.
  trainer_of() {
    local agent
    agent=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]]["pid"])' \
      "$state/node-agent/processes.json" "$(kubectl get pod "$1" -o jsonpath='{.metadata.uid}')")
    pgrep -P "$agent" | head -1
  }
  signal_trainer() { kill "-$1" "$2"; }
  log0=$state/node-agent/pods/default_$ft-worker-0/worker.log
  refresh_log0() { :; }
fi
# The step the job is at: the newest of rank 0's log (written in blocks), status.step (reported every few seconds)
# and the newest checkpoint.
last_step() {
  local a b c
  a=$(grep -oE 'worker: step step=[0-9]+' "$log0" 2>/dev/null | tail -1 | cut -d= -f2)
  b=$(ftj '{.status.step}')
  c=$(sed -n 's/^step-0*//p' "$ckpt_root/$ft/latest" 2>/dev/null)
  printf '%s\n' "${a:-0}" "${b:-0}" "${c:-0}" | sort -n | tail -1
}
injections=()   # "kind unix-time step"
uids_before="" uids_after_kill="" s_kill=0 node_before="" node_after="" request="" last_key=""
for i in $(seq 1 3000); do
  ftphase=$(ftj '{.status.phase}')
  restarts=$(ftj '{.status.restarts}')
  line=$(kubectl get trainingjobs.railyard.dev $ft --no-headers 2>/dev/null || true)
  key="$ftphase $restarts $(ftj '{.status.generation}')"
  # A line when phase, restarts or generation change, and every few polls in between (the progress column moves).
  if [ "$key" != "$last_key" ] || [ $((i % 2)) = 0 ]; then echo "$line"; last_key=$key; fi
  refresh_log0
  s=$(last_step)
  if [ ${#injections[@]} = 0 ] && [ "${s:-0}" -ge $((ft_steps / 4)) ] && [ "$ftphase" = Running ]; then
    uids_before=$(kubectl get pods -l railyard.dev/job=$ft -o jsonpath='{.items[*].metadata.uid}')
    pid=$(trainer_of $ft-worker-1) || { echo "no trainer process in $ft-worker-1"; exit 1; }
    echo ">> kill -9 $pid (rank 1's trainer in pod $ft-worker-1), job at step >= $s; last checkpoint $(cat "$ckpt_root/$ft/latest" 2>/dev/null)"
    signal_trainer 9 "$pid"
    injections+=("kill-9 $(date +%s.%N) $s")
    s_kill=$s
  elif [ ${#injections[@]} = 1 ] && [ -z "$uids_after_kill" ] && [ "$ftphase" = Running ] && [ "${restarts:-0}" = 1 ]; then
    uids_after_kill=$(kubectl get pods -l railyard.dev/job=$ft -o jsonpath='{.items[*].metadata.uid}')
  elif [ ${#injections[@]} = 1 ] && [ -n "$uids_after_kill" ] && [ "$ftphase" = Running ] &&
    [ "${s:-0}" -ge $((s_kill + 20)) ] && [ "${s:-0}" -le $((ft_steps * 3 / 4)) ]; then
    # Once the new generation trained 20 steps (its agents watch it from its start; the stall rule from its third step).
    node_before=$(kubectl get pod $ft-worker-1 -o jsonpath='{.spec.nodeName}' 2>/dev/null || true)
    pid=$(trainer_of $ft-worker-1 || true)
    if [ -n "$node_before" ] && [ -n "$pid" ]; then
      echo ">> SIGSTOP $pid (rank 1's trainer in pod $ft-worker-1 on $node_before), job at step >= $s: a hang, for its agent to find"
      signal_trainer STOP "$pid"
      echo "$pid" >"$state/stopped.pid"
      injections+=("hang $(date +%s.%N) $s")
    fi
  elif [ ${#injections[@]} = 2 ] && [ -z "$request" ] && [ "${restarts:-0}" = 2 ]; then
    request=$(ftj '{.status.lastRestart}')
    [ -n "$request" ] && echo ">> restart: status.lastRestart=$request"
  elif [ ${#injections[@]} = 2 ] && [ -z "$node_after" ] && [ "$ftphase" = Running ] && [ "${restarts:-0}" = 2 ]; then
    node_after=$(kubectl get pod $ft-worker-1 -o jsonpath='{.spec.nodeName}' 2>/dev/null || true)
    [ -n "$node_after" ] && echo ">> pod $ft-worker-1 now runs on $node_after"
  fi
  case "$ftphase" in Succeeded | Failed | Invalid) break ;; esac
  sleep 0.3
done
# A stopped trainer dies with its agent (the pod moved); continue it if it somehow did not.
[ -f "$state/stopped.pid" ] && { signal_trainer CONT "$(cat "$state/stopped.pid")" 2>/dev/null || true; rm -f "$state/stopped.pid"; }
refresh_log0 now
kubectl get trainingjobs.railyard.dev $ft -o wide
echo "last restart: $(ftj '{.status.lastRestart}')"
echo "excluded nodes: $(ftj '{.metadata.annotations.railyard\.dev/exclude-nodes}')"
if [ -n "$uids_after_kill" ] && [ "$uids_after_kill" = "$uids_before" ]; then
  echo "after the kill -9 no pod was re-created: the agents restarted their trainers in place (pod UIDs $uids_before)"
else
  echo "pod UIDs before the kill: $uids_before; after it: ${uids_after_kill:-not seen}"
fi
if [ -n "$node_before" ] && [ "$node_after" = "$node_before" ]; then
  echo "after the hang pod $ft-worker-1 stayed on $node_before (restarted in place: a stopped process is not its node's fault)"
elif [ -n "$node_before" ]; then
  echo "after the hang pod $ft-worker-1 moved from $node_before to ${node_after:-?}"
fi

step "loss curve and time lost"
python3 - "$log0" "$ftphase" "$(ftj '{.status.restarts}')" "$request" "$ft_start" "${injections[@]}" <<'PY'
import calendar, json, re, sys
from datetime import datetime
phase, restarts, request, start = sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
injections = [(k, float(t)) for k, t, _ in (x.split() for x in sys.argv[6:])]
# Log times are UTC.
ts = lambda l: calendar.timegm(datetime.strptime(l[:23], "%Y-%m-%dT%H:%M:%S.%f").timetuple()) + int(l[20:23]) / 1e3
log0 = [l for l in open(sys.argv[1]).read().splitlines() if l[:4].isdigit() and ts(l) >= start]
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
redone = len(runs) - len(final)
mean_ms = sum(r[2] for r in runs) / len(runs)
print(f"\nsteps {steps[-1]}, final loss {final[steps[-1]]:.4f}, job {phase}, restarts {restarts}, "
      f"failures injected {len(injections)} ({', '.join(k for k, _ in injections)})")
restores = [(ts(l), int(re.search(r" step=(\d+)", l).group(1)), re.search(r" from=(\S+)", l)) for l in log0
            if "checkpoint: restored " in l]
lost_total = 0.0
for k, t in injections:
    s = max((x[0] for x in runs if x[3] <= t), default=0)  # the last step logged before the failure
    after = [r for r in restores if r[0] > t]
    if not after:
        print(f"{k}: no restore after it")
        continue
    rt, r, src = after[0]
    first = next((x[3] for x in runs if x[3] > rt), None)
    if first is None:
        continue
    detect = ""
    if k == "hang" and request:
        q = json.loads(request)
        detect = (f"; {q.get('detector', '?')} found a {q.get('reason', '?')} of rank {q.get('rank', '?')} "
                  f"{q.get('detectSeconds', '?')} s after it began")
    lost_total += first - t
    print(f"{k} after step {s}: restored step {r} ({src.group(1) if src else '?'}), first step of the new generation "
          f"{first - t:.1f} s after the failure{detect}")
print(f"steps redone {redone}; time lost {lost_total + redone * mean_ms / 1e3:.1f} s (failure to first new step, plus "
      f"{redone} redone steps x {mean_ms:.0f} ms)")
PY
kubectl get trainingjobs.railyard.dev $ft -o json >"$state/$ft.json"
"$build/bin/railyard" report --log "$log0" --status "$state/$ft.json" \
  --checkpoints "$ckpt_root/$ft" --output "$state/$ft-report.html" | sed 's/^report: wrote /HTML report (loss curve, restarts, checkpoints): /'
echo
echo "The cluster, Prometheus ($PROMETHEUS_URL) and the operator keep running; the monitor stopped with the demo."
echo "Use them with:  eval \"\$(deploy/local/cluster.sh env --state-dir $state)\""
echo "Stop them with:  kill \$(cat $state/operator.pid); deploy/local/cluster.sh down --state-dir $state"
echo "scripts/test.sh can run beside them: each cluster with real nodes has its own bridge, pod and Service ranges,"
echo "DNS address and kube-proxy network namespace (docs/local-cluster.md \"Services and DNS\"); the tests bring up and"
echo "take down clusters of their own and leave this one alone."
[ "$phase" = Succeeded ] && [ "$ftphase" = Succeeded ]
