#!/usr/bin/env bash
# E2E on real nodes: `cluster.sh up --real-nodes 2` (kubelets + containerd + runc + a CNI bridge, images built by
# deploy/images/build.sh). Checks, in order:
#   1. the nodes register Ready with containerd as their runtime and carry the topology labels; the pod bridge has a
#      MAC of its own, unchanged at the end after every pod below came and went;
#   2. the tiny example, exactly as shipped (its own volume of the default class, its data prepared by its initializer
#      pod, checkpoints there), trains to Succeeded in
#      a container of localhost/railyard/worker, as uid 65532, with its own pod IP, passing the restricted Pod
#      Security Standard (its rules on the pod; no new privileges, a seccomp filter, no capabilities on the process); `kubectl logs` and `kubectl exec`
#      work on the worker pod while it runs; a process of the pod's uid cannot read the agent's environment (token,
#      CA key); its metrics-port annotation answers with the trainer's metrics;
#   3. placement shares a node: a foreign pod holding most of ry-real-0's CPU sends a job that requests CPU to
#      ry-real-1 (NodeResourcesFit over every pod on the node);
#   4. kill -9 of the trainer inside its container: in-place restart (same pod, generation 2) from the in-memory
#      tier, and the job still Succeeds with every step done;
#   5. a half-alive node (its kubelet SIGKILLed, its containers running on): the operator replaces the pod on the
#      other node; the old container, still on the pod network, is fenced by its pod UID (refused, stops) and never
#      joins again; the kubelet comes back and removes it; the job Succeeds with one restart for the fault, and its
#      final parameters equal bit for bit those of the same config trained undisturbed on the host;
#   6. the GPU example as shipped is accepted: its volume is made and its initializer pod (the worker's 32 CPUs and
#      256 GiB, no GPU) waits for a node that fits, no worker pod before it; with its data taken as prepared (the
#      initializer left out), it waits with its Scheduled condition naming the missing nvidia.com/gpu.
set -euo pipefail
# shellcheck source=../lib/real_env.sh
source "${RAILYARD_SOURCE_DIR:?}/tests/e2e/lib/real_env.sh" real-e2e
op_pid=""
ref_pid=""
fail() {
  echo "FAIL: $*" >&2
  kubectl get nodes -o wide >&2 || true
  kubectl get tj,pods -n "$ns" -o wide >&2 || true
  kubectl get events -n "$ns" --sort-by=.lastTimestamp 2>/dev/null | tail -20 >&2 || true
  tail -n 30 "$work/op.log" >&2 || true
  for f in "$state"/logs/ry-real-*.log; do [ -f "$f" ] && { echo "== $f" >&2; tail -n 8 "$f" >&2; }; done
  exit 1
}
# shellcheck source=../operator/lib.sh
source "$src/tests/e2e/operator/lib.sh"
cleanup() {
  [ -n "$ref_pid" ] && kill "$ref_pid" 2>/dev/null || true
  cleanup_operator_cluster
}
trap cleanup EXIT

# --- 1. nodes ----------------------------------------------------------------------------------------------
bash "$cluster" down --state-dir "$state" >/dev/null 2>&1 || true
t0=$SECONDS
bash "$cluster" up --state-dir "$state" --real-nodes 2 >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; fail "cluster up"; }
log "cluster with 2 real nodes up in $((SECONDS - t0)) s"
# The pod bridge keeps the MAC cluster.sh gave it while pods come and go (without one it follows its ports' smallest,
# and the pods' ARP entries for the operator's address go stale: a pod falls silent for seconds).
bridge=$(cat "$state/real/bridge")
[ "$(cat "/sys/class/net/$bridge/addr_assign_type")" = 3 ] || fail "bridge $bridge has no MAC of its own (addr_assign_type $(cat "/sys/class/net/$bridge/addr_assign_type"))"
bridge_mac=$(cat "/sys/class/net/$bridge/address")
eval "$(bash "$cluster" env --state-dir "$state")"
[ -n "${RAILYARD_POD_HOST_ADDR:-}" ] || fail "cluster.sh env gives no RAILYARD_POD_HOST_ADDR"
for n in ry-real-0 ry-real-1; do
  rt=$(kubectl get node "$n" -o jsonpath='{.status.nodeInfo.containerRuntimeVersion}')
  case "$rt" in containerd://*) ;; *) fail "$n runtime '$rt', want containerd://" ;; esac
  [ "$(kubectl get node "$n" -o jsonpath='{.metadata.labels.railyard\.dev/unit}')" = unit-0 ] || fail "$n: no unit label"
  [ -n "$(kubectl get node "$n" -o jsonpath='{.status.allocatable.cpu}')" ] || fail "$n: no allocatable cpu"
done
# The operator on the host, telling pods to dial it at the host's address on the pod network.
install_crd "$src"
shared=$(bash "$cluster" share "$ns" --state-dir "$state")
"$bin/railyard" data prepare --input /usr/share/common-licenses/* --output "$shared/data" >/dev/null
start_host_operator
jp() { kubectl get tj "$1" -n "$ns" -o jsonpath="$2" 2>/dev/null; }
wait_phase() { # job phase seconds
  local t=$SECONDS p
  while :; do
    p=$(jp "$1" '{.status.phase}')
    [ "$p" = "$2" ] && return 0
    case "$p" in Failed | Invalid) fail "$1 ended $p: $(jp "$1" '{.status.conditions}')" ;; esac
    [ $((SECONDS - t)) -lt "$3" ] || fail "$1 not $2 after $3 s (phase '$p')"
    sleep 0.5
  done
}

# --- 2. the tiny example, unchanged ------------------------------------------------------------------------
# Its own volume (tiny-storage, of the default class railyard-local) and data (its initializer pod) before its worker.
t0=$SECONDS
kubectl apply -n "$ns" -f "$src/deploy/examples/tiny.yaml" >/dev/null
pod=tiny-worker-0
wait_for 120 "tiny's initializer Succeeded" sh -c "[ \"\$(kubectl get tj tiny -n $ns -o jsonpath='{.status.initializer.phase}')\" = Succeeded ]"
log "tiny: its volume and data ready after $((SECONDS - t0)) s"
tiny_dir=$state/volumes/$(kubectl get pvc tiny-storage -n "$ns" -o jsonpath='{.spec.volumeName}')
wait_for 120 "tiny's pod Running" sh -c "[ \"\$(kubectl get pod $pod -n $ns -o jsonpath='{.status.phase}')\" = Running ]"
log "tiny: pod Running after $((SECONDS - t0)) s on $(kubectl get pod $pod -n "$ns" -o jsonpath='{.spec.nodeName}')"
ip=$(kubectl get pod $pod -n "$ns" -o jsonpath='{.status.podIP}')
case "$ip" in "${RAILYARD_POD_HOST_ADDR%.1}".*) ;; *) fail "pod IP '$ip' is not on the pod network" ;; esac
[ "$(kubectl get pod $pod -n "$ns" -o jsonpath='{.status.containerStatuses[0].image}')" = localhost/railyard/worker:0.1.0 ] ||
  fail "the worker does not run from localhost/railyard/worker:0.1.0"
wait_for 60 "kubectl logs shows training steps" sh -c "kubectl logs $pod -n $ns | grep -q 'step='"
[ "$(kubectl exec $pod -n "$ns" -- id -u)" = 65532 ] || fail "kubectl exec: the worker does not run as uid 65532"
restricted_pods "$ns" $pod || fail "tiny's worker pod breaks the restricted Pod Security Standard (above)"
grep -q '^train_' <<<"$(kubectl exec $pod -n "$ns" -- ls /shared/data)" || fail "kubectl exec: no shards under /shared/data"
# The agent (PID 1) holds the job's token and CA key in its environment; a process of the pod's uid (a rank, an exec)
# cannot read it: the agent is not dumpable, so its /proc files belong to root. Its own environment it reads.
secrets=$(kubectl exec $pod -n "$ns" -- sh -c 'tr "\0" "\n" </proc/1/environ 2>&1 | grep -c RAILYARD_RENDEZVOUS_TOKEN || true')
[ "$secrets" = 0 ] || fail "a process of the pod's uid read the agent's environment (RAILYARD_RENDEZVOUS_TOKEN)"
mport=$(kubectl get pod $pod -n "$ns" -o jsonpath='{.metadata.annotations.railyard\.dev/metrics-port}')
[ -n "$mport" ] || fail "no railyard.dev/metrics-port annotation on the worker pod"
wait_for 30 "the trainer's /metrics on $ip:$mport" sh -c "curl -sf --max-time 2 http://$ip:$mport/metrics | grep -q '^railyard_worker_step'"
wait_phase tiny Succeeded 300
log "tiny: Succeeded after $((SECONDS - t0)) s"
[ "$(jp tiny '{.status.progress}')" = "200/200" ] || fail "tiny progress $(jp tiny '{.status.progress}'), want 200/200"
ls "$tiny_dir/checkpoints/tiny" | grep -q . || fail "no checkpoint under tiny's volume $tiny_dir: $(find "$tiny_dir" | head)"

# --- 3. a node shared with a foreign pod -------------------------------------------------------------------
alloc=$(kubectl get node ry-real-0 -o jsonpath='{.status.allocatable.cpu}')
alloc_m=$(python3 -c 'import sys; q=sys.argv[1]; print(int(q[:-1]) if q.endswith("m") else int(float(q)*1000))' "$alloc")
hold=$((alloc_m - 400))
kubectl apply -n "$ns" -f - >/dev/null <<EOT
apiVersion: v1
kind: Pod
metadata: {name: foreign}
spec:
  nodeName: ry-real-0
  containers:
    - name: sleeper
      image: localhost/railyard/worker:0.1.0
      command: [sleep, "3600"]
      resources: {requests: {cpu: "${hold}m"}}
EOT
wait_for 60 "the foreign pod Running" sh -c "[ \"\$(kubectl get pod foreign -n $ns -o jsonpath='{.status.phase}')\" = Running ]"
# A longer job that asks for 1 CPU (does not fit beside the foreign pod), checkpoints every 10 steps and keeps
# every step in memory.
sed -e "s|name: tiny|name: fit|" -e "s|steps: 200|steps: 2000|" -e "s|/shared/checkpoints/tiny|/shared/checkpoints/fit|" \
  -e "s|intervalSteps: 50|intervalSteps: 10|" <(example_as_on_host tiny railyard-shared) |
  python3 -c '
import os, sys, yaml
j = yaml.safe_load(sys.stdin)
j["spec"]["resources"] = {"requests": {"cpu": "1"}}
# The OpenBLAS kernel choice of this machine (some set OPENBLAS_CORETYPE) in the container too: the undisturbed run on
# the host below is compared bit for bit, and another kernel rounds differently.
env = [{"name": k, "value": v} for k, v in sorted(os.environ.items()) if k.startswith("OPENBLAS_")]
if env:
    j["spec"]["template"]["spec"]["containers"][0]["env"] = env
print(yaml.safe_dump(j))' |
  kubectl apply -n "$ns" -f - >/dev/null
wait_for 120 "fit's pod Running" sh -c "[ \"\$(kubectl get pod fit-worker-0 -n $ns -o jsonpath='{.status.phase}')\" = Running ]"
node=$(kubectl get pod fit-worker-0 -n "$ns" -o jsonpath='{.spec.nodeName}')
[ "$node" = ry-real-1 ] || fail "fit placed on '$node' beside a foreign pod holding ${hold}m of ${alloc_m}m CPU; want ry-real-1"
log "placement: fit went to ry-real-1 (ry-real-0 has ${hold}m of ${alloc_m}m CPU held by a foreign pod)"
kubectl delete pod foreign -n "$ns" --grace-period=0 --force >/dev/null 2>&1 || true

# --- 4. kill -9 of the trainer inside its container --------------------------------------------------------
uid=$(kubectl get pod fit-worker-0 -n "$ns" -o jsonpath='{.metadata.uid}')
wait_for 60 "fit past step 40" sh -c "s=\$(kubectl get tj fit -n $ns -o jsonpath='{.status.step}'); [ \"\${s:-0}\" -ge 40 ]"
# The undisturbed run, for the final parameters after both faults (one process: dp=1 needs no deterministic mode):
# the very config generation 1's trainer got (the agent keeps it in its work dir in the container), its /shared paths
# mapped to the host's directory behind the claim, without checkpoints, on as many threads as the container's trainer;
# it trains on the host beside the job and exports its final weights.
kubectl exec fit-worker-0 -n "$ns" -- cat "/tmp/railyard-agent/${ns}_fit_fit-worker-0/gen-1/config.json" >"$work/gen1.json" ||
  fail "no generation-1 config in fit-worker-0"
fit_threads=$(kubectl logs fit-worker-0 -n "$ns" | grep -oE 'worker: model .*threads=[0-9]+' | head -1 | grep -oE '[0-9]+$')
[ -n "$fit_threads" ] || fail "the trainer's log names no thread count"
python3 - "$work/gen1.json" "$work/ref.json" "$shared" <<'PY' || fail "generation 1's config: unexpected shape"
import json, sys
c = json.load(open(sys.argv[1]))
def host(v):
    return v.replace("/shared/", sys.argv[3] + "/", 1) if isinstance(v, str) and v.startswith("/shared/") else v
def walk(x):
    return {k: walk(v) for k, v in x.items()} if isinstance(x, dict) else [walk(v) for v in x] if isinstance(x, list) else host(x)
c = walk(c)
assert c.get("world_size", 1) == 1, c.get("world_size")
c.update(restore="")
c.pop("checkpoint", None)
json.dump(c, open(sys.argv[2], "w"))
PY
"$bin/railyard-worker" train --config "$work/ref.json" --threads "$fit_threads" --export "$work/ref.bin" >"$work/ref.log" 2>&1 &
ref_pid=$!
t0=$SECONDS
kubectl exec fit-worker-0 -n "$ns" -- sh -c 'for d in /proc/[0-9]*; do
  if tr "\0" " " <"$d/cmdline" 2>/dev/null | grep -q "[r]ailyard-worker train"; then kill -9 "${d#/proc/}"; echo killed; fi
done' | grep -q killed || fail "no trainer process found in the container to kill"
wait_for 60 "fit restarted in place (generation 2)" sh -c "[ \"\$(kubectl get tj fit -n $ns -o jsonpath='{.status.generation}')\" -ge 2 ]"
[ "$(kubectl get pod fit-worker-0 -n "$ns" -o jsonpath='{.metadata.uid}')" = "$uid" ] || fail "kill -9 re-created the pod"
[ "$(jp fit '{.status.lastRestart.reason}')" = WorkerExit ] || fail "lastRestart.reason '$(jp fit '{.status.lastRestart.reason}')'"
# Zero steps lost: generation 2 restores from the pod's shared memory a step no older than the last one generation 1
# reported (the container's log holds both generations: the agent is the container's process).
wait_for 60 "generation 2 to restore" sh -c "kubectl logs fit-worker-0 -n $ns | grep -q 'checkpoint: restored '"
klog=$(kubectl logs fit-worker-0 -n "$ns")
rline=$(grep 'checkpoint: restored ' <<<"$klog" | tail -1)
from=$(grep -oE ' from=[^ ]+' <<<"$rline" | cut -d= -f2)
r=$(grep -oE ' step=[0-9]+' <<<"$rline" | cut -d= -f2)
gen1_last=$(sed -n '/checkpoint: restored /q;p' <<<"$klog" | grep -oE 'worker: step step=[0-9]+' | tail -1 | cut -d= -f2)
[ "$from" = memory ] || fail "generation 2 restored from '$from', want memory ($rline)"
[ -n "$gen1_last" ] && [ "$r" -ge "$gen1_last" ] ||
  fail "restored step $r, generation 1 had reported ${gen1_last:-nothing}: steps lost"
kill_recovery=$((SECONDS - t0)) kill_lost=$((gen1_last > r ? gen1_last - r : 0))
log "kill -9: restarted in place, step $r restored from memory (generation 1 reported $gen1_last) after $kill_recovery s"

# --- 5. a half-alive node: its kubelet SIGKILLed while its container trains on ------------------------------
# The node turns NotReady and the operator replaces the pod under the same name on ry-real-0, while the old container
# on ry-real-1 still reaches the operator. Fenced by pod UID, it is refused and stops: one restart, no second world.
wait_for 60 "fit past step 150" sh -c "s=\$(kubectl get tj fit -n $ns -o jsonpath='{.status.step}'); [ \"\${s:-0}\" -ge 150 ]"
t0=$SECONDS
old_uid=$(kubectl get pod fit-worker-0 -n "$ns" -o jsonpath='{.metadata.uid}')
reached=$(jp fit '{.status.step}')
sock1="$state/real/ry-real-1/run/containerd.sock"
# The tasks of fit's old pod on ry-real-1 as containerd knows them: "<container> <STATUS>" lines; $1 narrows it to one
# container name (worker; the sandbox is the pod's pause container).
old_tasks() {
  local filter="labels.\"io.kubernetes.pod.uid\"==$old_uid" ids id
  [ -z "${1:-}" ] || filter+=",labels.\"io.kubernetes.container.name\"==$1"
  ids=$(ctr -a "$sock1" -n k8s.io containers ls -q "$filter" 2>/dev/null)
  for id in $ids; do ctr -a "$sock1" -n k8s.io tasks ls 2>/dev/null | awk -v id="$id" '$1 == id {print $1, $3}'; done
}
worker_is() { [ "$(old_tasks worker | awk '{print $2}')" = "$1" ]; }
# Its init exited: containerd marks the task STOPPED, and drops it once the shim is gone.
worker_ended() { ! grep -q RUNNING <<<"$(old_tasks worker)"; }
none_running() { ! grep -q RUNNING <<<"$(old_tasks)"; }
fenced_in_log() { grep -q "refused a pod that no longer holds its name.* uid=$old_uid" "$work/op.log"; }
worker_is RUNNING || fail "no running worker container of fit on ry-real-1 before the fault: $(old_tasks)"
bash "$cluster" kill-kubelet ry-real-1 --state-dir "$state" >/dev/null
wait_for 90 "fit's pod replaced on ry-real-0" sh -c "[ \"\$(kubectl get pod fit-worker-0 -n $ns -o jsonpath='{.spec.nodeName}')\" = ry-real-0 ] && [ \"\$(kubectl get pod fit-worker-0 -n $ns -o jsonpath='{.status.phase}')\" = Running ]"
node_recovery=$((SECONDS - t0))
log "half-alive node: pod running again on ry-real-0 after $node_recovery s"
wait_for 60 "the replacement restoring" sh -c "kubectl logs fit-worker-0 -n $ns | grep -q 'checkpoint: restored '"
restored=$(kubectl logs fit-worker-0 -n "$ns" | grep 'checkpoint: restored ' | tail -1 | grep -oE ' step=[0-9]+' | cut -d= -f2)
node_lost=$((reached > restored ? reached - restored : 0))
[ "$node_lost" -le 20 ] || fail "the replacement restored step $restored, the job had reached $reached: more than the interval lost"
# The old container, alive under a dead kubelet, asked to join again and was refused by UID; it killed its trainer
# and exited (the agent's exit 202), with no kubelet to tell it so.
wait_for 60 "the leftover on ry-real-1 fenced" fenced_in_log
until worker_ended; do
  [ $((SECONDS - t0)) -lt 120 ] || {
    echo "tasks of the old pod: $(old_tasks)" >&2
    ps -eo pid,ppid,stat,wchan:32,args | grep -E '[r]ailyard-worker|[c]ontainerd-shim' >&2 || true
    for p in $(pgrep -f '^railyard-worker agent'); do
      echo "threads of $p:" >&2
      for t in /proc/"$p"/task/*; do echo "  ${t##*/} $(cat "$t/stat" | cut -d' ' -f3) $(cat "$t/wchan" 2>/dev/null)" >&2; done
    done
    tail -n 15 "$state"/real/ry-real-1/logs/pods/"${ns}_fit-worker-0_$old_uid"/worker/*.log >&2 || true
    fail "the leftover's worker container still runs $((SECONDS - t0)) s after its kubelet died"
  }
  sleep 0.3
done
grep -q 'agent_restarted' "$work/op.log" && fail "the leftover broke the new world (agent restarted)"
log "the leftover on ry-real-1 was fenced by UID and stopped $((SECONDS - t0)) s after its kubelet died"
# The reverse: the kubelet comes back, finds its pod deleted and stops what is left of it. The job is not touched.
bash "$cluster" start-node ry-real-1 --state-dir "$state" >/dev/null
wait_for 60 "ry-real-1 Ready again" sh -c "kubectl get node ry-real-1 -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -q True"
wait_for 90 "the old pod's sandbox stopped by the returning kubelet" none_running
wait_phase fit Succeeded 400
[ "$(jp fit '{.status.progress}')" = "2000/2000" ] || fail "fit progress $(jp fit '{.status.progress}'), want 2000/2000"
[ "$(jp fit '{.status.restarts}')" = 2 ] || fail "fit restarts $(jp fit '{.status.restarts}'), want 2 (one per fault)"
[ "$(kubectl get pod fit-worker-0 -n "$ns" -o jsonpath='{.spec.nodeName}')" = ry-real-0 ] || fail "fit's pod moved again"
# The final parameters equal the undisturbed run's, bit for bit: the job's last checkpoint (step 2000), restored by one
# process and exported as the reference was (parameters only: equal bytes, equal parameters).
wait "$ref_pid" || { tail -n 20 "$work/ref.log" >&2; fail "the undisturbed reference run failed"; }
ref_pid=""
grep -q "threads=$fit_threads\$" <<<"$(grep -oE 'worker: model .*threads=[0-9]+' "$work/ref.log")" ||
  fail "the reference ran on other threads than the job's $fit_threads"
last=$(cat "$shared/checkpoints/fit/latest")
[ "$last" = step-00002000 ] || fail "fit's newest checkpoint is $last, not step 2000"
"$bin/railyard-worker" train --config "$work/ref.json" --threads "$fit_threads" --resume "$shared/checkpoints/fit/$last" \
  --export "$work/final.bin" >"$work/final.log" 2>&1 || { tail -n 20 "$work/final.log" >&2; fail "exporting fit's final checkpoint"; }
! grep -q 'worker: step step=' "$work/final.log" || fail "the export trained steps past the final checkpoint"
params_sha=$(sha256sum <"$work/final.bin" | cut -d' ' -f1)
[ "$params_sha" = "$(sha256sum <"$work/ref.bin" | cut -d' ' -f1)" ] ||
  fail "fit's final parameters after kill -9 and a half-alive node differ from the undisturbed run's"
log "fit: final parameters after both faults bitwise the undisturbed run's (sha256 ${params_sha:0:16})"
if [ -n "${RAILYARD_RESULTS_DIR:-}" ]; then
  mkdir -p "$RAILYARD_RESULTS_DIR"
  cat >"$RAILYARD_RESULTS_DIR/real_nodes.json" <<EOT
{"date": "$(date -u +%FT%TZ)", "job": "fit", "steps": 2000, "restarts": 2, "passed": true,
 "faults": [
  {"kind": "trainer kill -9 in its container", "restarts": 1, "steps_lost": $kill_lost, "recovery_s": $kill_recovery,
   "recovery": "kill to the new generation's restore"},
  {"kind": "kubelet SIGKILL under a running container (half-alive node), the leftover fenced", "restarts": 1,
   "steps_lost": $node_lost, "recovery_s": $node_recovery, "recovery": "kill to the replacement Running"}]}
EOT
fi

# --- 6. the GPU example on nodes without GPUs --------------------------------------------------------------
kubectl apply -n "$ns" -f "$src/deploy/examples/gpt2-350m-h100.yaml" >/dev/null
wait_for 60 "gpt2-350m's volume and initializer pod" sh -c "kubectl get pvc gpt2-350m-storage -n $ns >/dev/null 2>&1 && kubectl get pod gpt2-350m-initializer -n $ns >/dev/null 2>&1"
[ "$(jp gpt2-350m '{.status.phase}')" != Invalid ] || fail "gpt2-350m is Invalid: $(jp gpt2-350m '{.status.conditions}')"
[ "$(kubectl get pvc gpt2-350m-storage -n "$ns" -o jsonpath='{.spec.resources.requests.storage}')" = 1Ti ] ||
  fail "gpt2-350m-storage: $(kubectl get pvc gpt2-350m-storage -n "$ns" -o jsonpath='{.spec}')"
[ "$(kubectl get pod gpt2-350m-initializer -n "$ns" -o jsonpath='{.spec.containers[0].resources.requests.cpu}')" = 32 ] ||
  fail "gpt2-350m's initializer does not ask for the worker's CPUs: $(kubectl get pod gpt2-350m-initializer -n "$ns" -o jsonpath='{.spec.containers[0].resources}')"
kubectl get pod gpt2-350m-initializer -n "$ns" -o jsonpath='{.spec.containers[0].resources}' | grep -q nvidia.com/gpu &&
  fail "gpt2-350m's initializer asks for GPUs"
wait_for 60 "gpt2-350m's initializer unschedulable" sh -c "kubectl get pod gpt2-350m-initializer -n $ns -o jsonpath='{.status.conditions[?(@.type==\"PodScheduled\")].reason}' | grep -q Unschedulable"
[ "$(jp gpt2-350m '{.status.conditions[?(@.type=="Initialized")].status}')" = False ] ||
  fail "gpt2-350m's Initialized condition: $(jp gpt2-350m '{.status.conditions}')"
[ -z "$(kubectl get pods -n "$ns" -l railyard.dev/job=gpt2-350m,railyard.dev/role!=initializer -o name)" ] ||
  fail "gpt2-350m got worker pods before its data"
log "gpt2-350m-h100 example: accepted, its volume made, its initializer waiting for a node with 32 CPUs and 256 GiB"
kubectl delete tj gpt2-350m -n "$ns" --wait=false >/dev/null
example_as_on_host gpt2-350m-h100 | sed -e "s|name: gpt2-350m|name: gpt2-noinit|" | kubectl apply -n "$ns" -f - >/dev/null
gmsg() { kubectl get tj gpt2-noinit -n "$ns" -o jsonpath='{.status.conditions[?(@.type=="Scheduled")].message}' 2>/dev/null; }
wait_for 60 "gpt2-noinit's Scheduled condition" sh -c "kubectl get tj gpt2-noinit -n $ns -o jsonpath='{.status.conditions[?(@.type==\"Scheduled\")].status}' | grep -q False"
case "$(gmsg)" in *"nvidia.com/gpu"*) ;; *) fail "gpt2-noinit waits without naming the missing GPUs: '$(gmsg)'" ;; esac
[ -z "$(kubectl get pods -n "$ns" -l railyard.dev/job=gpt2-noinit -o jsonpath='{.items[?(@.spec.nodeName)].metadata.name}')" ] ||
  fail "a gpt2-noinit pod was bound to a node without GPUs"
log "gpt2-350m-h100 example without its initializer: waiting: $(gmsg)"
[ "$(cat "/sys/class/net/$bridge/address")" = "$bridge_mac" ] ||
  fail "bridge $bridge changed its MAC from $bridge_mac to $(cat "/sys/class/net/$bridge/address") while pods came and went"
log "real nodes e2e: ok ($((SECONDS - t_all)) s)"
