#!/usr/bin/env bash
# 1,000-replica benchmark (issue 3): the Railyard operator creating and binding the pods of one TrainingJob vs the
# built-in Job controller creating the same number of pods, on the same local API server and the same nodes.
#   tests/bench/operator/thousand_replicas.sh [--build-dir DIR] [--replicas N[,N...]] [--nodes M] [--state-dir DIR]
#                                             [--no-nodes]
# --replicas 1000,3000,10000: the rounds run every size in turn on the one cluster (the scaling curve: medians per
# size, and the operator's CPU and peak RSS per 1,000 pods); default 1000.
# --nodes M: M simulated nodes (default: the largest size; a worker pod holds a whole node, so a gang of N pods needs
# N nodes). --no-nodes: no simulated nodes at all; both controllers only create pods (nothing can be bound).
# Env: OPERATOR_ARGS (more railyard-operator flags, e.g. "--api-parallelism 64"), ONLY_EQUAL=1 (only the runs at
# equal, unthrottled limits), ROUNDS=N (N alternating rounds of operator and Job controller on the one cluster, then
# medians with min-max; default 1), PERF_OUT=PREFIX (perf record -g of the operator during each run, to PREFIX.NS),
# OPERATOR_ARGS_B (an A/B: each round also runs the operator at equal limits with these flags instead, e.g.
# "--api-parallelism 64", labelled "equal, B"), PAUSE_NODES=1 (each round also runs the operator at equal limits with
# the node agent stopped (SIGSTOP) from the create request until the count completes, labelled "equal, nodes paused":
# what the nodes' own reaction to the bound pods (process starts, status writes, events on the same API server and
# cores) adds to the time; read it as a decomposition, not as the figure to quote).
# NODES_IDLE=1 (the node agent runs with --no-pods: nodes register and stay Ready, but bound pods get no process,
# status write or event: the API server then serves the creators alone, as it does for the Job controller's unbound
# pods. Needed above a few thousand pods: one node agent on 2 cores removed about 11 pods a second and started fewer,
# and would work through a 10,000-pod round for many minutes, into the next runs; docs/node-agent.md).
# JC_OUR_PODS=1 (each round also runs the Job controller at equal limits with the operator's own worker pod as its
# template, labelled "equal, our pods": one pod of the operator's run, less its name, owner, node and status; what the
# pods' size costs the API server, apart from who creates them).
# Starts its own local cluster (M simulated 8-GPU nodes: the operator places one worker pod per node, one pod of a
# job per node being Railyard's model) in --state-dir and stops it at the end. Up to 1,000 nodes the cluster gets
# Kubernetes' default node-monitor grace (40 s, not the local default 4 s) and the node agent renews leases every 10 s
# like a kubelet: 1,000 nodes cost 100 lease writes per second. Above 1,000 nodes the lease interval grows with the
# node count (M/100 s, grace 4x that, at most 600 s; node status every 6 lease intervals), so that the nodes' own
# writes stay at about 100 per second at every size: 10,000 kubelets' 1,000 writes per second would be the 2-core
# machine's whole API server, and the curve would show the harness, not the operator. The controller manager that
# lifts new nodes' not-ready taints runs at 200 QPS (cluster.sh --controller-manager-qps) so that 10,000 nodes are
# schedulable in minutes; the Job controller under test is a separate controller manager at the limits below.
# The operator runs twice: at its default client limits (QPS 50 / burst 1000) and at the Job controller's
# unthrottled setting (1000 / 2000); the Job controller at its defaults (20 / 30) and at 1000 / 2000.
# Timing: from the create request to the watch event (kubectl get -w, one stream) that completes the count of N pods created
# (and, for the operator, bound: the local cluster has no kube-scheduler, so the Job controller's pods stay unbound).
# CPU seconds and peak RSS are the controller process's own (/proc/PID/stat, VmHWM).
set -euo pipefail
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
BUILD_DIR="$REPO_ROOT/build"
SIZES=1000
NODES=""
NO_NODES=no
STATE_DIR=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD_DIR="$2"; shift 2 ;;
    --replicas) SIZES="$2"; shift 2 ;;
    --nodes) NODES="$2"; shift 2 ;;
    --state-dir) STATE_DIR="$2"; shift 2 ;;
    --no-nodes) NO_NODES=yes; shift ;;
    -h | --help) sed -n '2,38p' "$0"; exit 0 ;;
    *) echo "thousand_replicas.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
IFS=, read -r -a SIZE_LIST <<<"$SIZES"
MAX_N=0
for N in "${SIZE_LIST[@]}"; do
  [[ "$N" =~ ^[0-9]+$ ]] && [ "$N" -ge 8 ] && [ $((N % 8)) = 0 ] ||
    { echo "thousand_replicas.sh: --replicas '$SIZES': give multiples of 8, separated by commas" >&2; exit 2; }
  [ "$N" -le "$MAX_N" ] || MAX_N=$N
done
BIN="$BUILD_DIR/bin"
for b in railyard-operator railyard-node-agent; do
  [ -x "$BIN/$b" ] || { echo "thousand_replicas.sh: $BIN/$b missing: cmake --build $BUILD_DIR --target $b" >&2; exit 1; }
done
STATE_DIR="${STATE_DIR:-$BUILD_DIR/bench-operator-cluster}"
CLUSTER="$REPO_ROOT/deploy/local/cluster.sh"
WORK="$(mktemp -d)"
NODES=${NODES:-$MAX_N}
[[ "$NODES" =~ ^[0-9]+$ ]] && [ $((NODES % 8)) = 0 ] && [ "$NODES" -ge "$MAX_N" ] ||
  { echo "thousand_replicas.sh: --nodes '$NODES': give a multiple of 8, at least the largest size ($MAX_N)" >&2; exit 2; }
[ "$NO_NODES" = yes ] && NODES=0
# The nodes' write rate held at about 100 per second (see the top).
LEASE_S=$((NODES > 1000 ? NODES / 100 : 10))
GRACE_S=$((4 * LEASE_S > 600 ? 600 : 4 * LEASE_S))
STATUS_S=$((LEASE_S > 10 ? 6 * LEASE_S : 60))
pids=()
cleanup() {
  for p in ${pids[@]+"${pids[@]}"}; do kill "$p" 2>/dev/null || true; kill -CONT "$p" 2>/dev/null || true; done
  for p in ${pids[@]+"${pids[@]}"}; do wait "$p" 2>/dev/null || true; done
  bash "$CLUSTER" down --state-dir "$STATE_DIR" >/dev/null 2>&1 || true
  [ -n "${KEEP_WORK:-}" ] && echo "work dir kept: $WORK" >&2 || rm -rf "$WORK"
}
trap cleanup EXIT

cat >"$WORK/topology.yaml" <<TOPO
# $NODES simulated 8-GPU nodes for the gang benchmark ($SIZES replicas): units of 8 nodes, leaves of at most 1,000
# nodes (the topology's limit is 1,024 units per leaf), one spine.
gpuType: h100-sxm
gpusPerNode: 8
nodesPerUnit: 8
unitsPerLeaf: $((NODES > 1000 ? 125 : NODES / 8))
leavesPerSpine: $(((NODES + 999) / 1000))
units: $((NODES / 8))
cpu: "64"
memory: 512Gi
pods: 110
namePrefix: bench
TOPO
echo "date: $(date -u +%FT%TZ)"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(uname -sr)"
echo "cluster: $NODES nodes x 8 GPUs (node agent: lease every $LEASE_S s, grace $GRACE_S s, status every $STATUS_S s$([ -n "${NODES_IDLE:-}" ] && echo ", pods left alone: NODES_IDLE")), starting..."
# cluster.sh waits 60 s for the nodes; registering 1,000 takes longer (about 7 per second here), so the control plane
# comes up without the agent and the agent is started (and stopped) here.
bash "$CLUSTER" up --state-dir "$STATE_DIR" --no-node-agent --node-monitor-grace "$GRACE_S" \
  --controller-manager-qps 200 >"$WORK/up.log" 2>&1 ||
  { cat "$WORK/up.log" >&2; exit 1; }
if [ "$NODES" -gt 0 ]; then
AGENT_KUBECONFIG="$STATE_DIR/node-agent.kubeconfig"
[ -f "$AGENT_KUBECONFIG" ] || AGENT_KUBECONFIG="$STATE_DIR/kubeconfig"
"$BIN/railyard-node-agent" run --kubeconfig "$AGENT_KUBECONFIG" --state-dir "$WORK/node-agent" \
  --topology "$WORK/topology.yaml" --lease-interval "$LEASE_S" --node-status-interval "$STATUS_S" \
  $([ -n "${NODES_IDLE:-}" ] && echo --no-pods) >"$WORK/node-agent.log" 2>&1 &
NODE_AGENT_PID=$!
pids+=($NODE_AGENT_PID)
fi
eval "$(bash "$CLUSTER" env --state-dir "$STATE_DIR")"
export KUBECONFIG="$STATE_DIR/kubeconfig"
CACHE_BIN="$(sed -n 's/^export CACHE_BIN=//p' "$STATE_DIR/cluster.env" 2>/dev/null || true)"
KUBECTL="$CACHE_BIN/kubectl"
[ -x "$KUBECTL" ] || KUBECTL="$(command -v kubectl)"
k() { "$KUBECTL" "$@"; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cpu_seconds() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }
peak_rss_mib() { awk '/VmHWM/ {printf "%.0f", $2 / 1024}' "/proc/$1/status"; }
now() { date +%s.%N; }
# The control plane's and the nodes' CPU seconds (kube-apiserver, etcd, kube-controller-manager, node agent), for
# where_cpu: what a run cost the rest of the machine besides the creator.
plane_pids() {
  local c
  for c in kube-apiserver etcd kube-controller-manager; do cat "$STATE_DIR/pids/$c.pid" 2>/dev/null || echo 0; done
  echo "${NODE_AGENT_PID:-0}"
}
plane_cpu() { local p; for p in $(plane_pids); do [ -r "/proc/$p/stat" ] && cpu_seconds "$p" || echo 0; done | xargs; }
# where_cpu "BEFORE": the CPU seconds each used since plane_cpu printed BEFORE.
where_cpu() {
  python3 -c 'import sys; n = ["apiserver", "etcd", "controller-manager", "node agent"]
b, a = map(float, sys.argv[1].split()), map(float, sys.argv[2].split())
print("  CPU during the run: " + ", ".join(f"{w} {y - x:.2f} s" for w, x, y in zip(n, b, a)))' "$1" "$(plane_cpu)"
}

# wait_pods NS SELECTOR NEED_BOUND T0 LIMIT: prints "created_s bound_s" (bound_s "-" when not asked), from one watch
# stream (`kubectl get -w`: its initial list, then every change). Until 2026-11-29 this listed the 1,000 pods every
# 0.2 s: perf showed those kubectl processes taking 25 % of the machine's CPU (and the API server serving them)
# while the operator created its pods, slowing most the run that took longest.
wait_pods() {
  local ns=$1 sel=$2 need_bound=$3 t0=$4 limit=$5
  timeout "$limit" "$KUBECTL" get pods -n "$ns" -l "$sel" -w --no-headers \
    -o custom-columns=N:.metadata.name,NODE:.spec.nodeName 2>/dev/null |
    python3 -c '
import sys, time
n, need_bound, t0 = int(sys.argv[1]), sys.argv[2] == "yes", float(sys.argv[3])
seen, bound, created = set(), set(), None
for line in sys.stdin:
    f = line.split()
    if len(f) < 2:
        continue
    # The first event: the first pod created, or the initial list of a kubectl that took longer to start
    # (2-3.5 s on a loaded 2-core machine, for either creator): so it does not time when the creator started.
    if not seen:
        print(f"  first pod seen at {time.time() - t0:.3f} s", file=sys.stderr, flush=True)
    seen.add(f[0])
    if f[1] != "<none>":
        bound.add(f[0])
    t = time.time() - t0
    if created is None and len(seen) >= n:
        created = t
    if created is not None and (not need_bound or len(bound) >= n):
        print(f"{created:.3f} " + (f"{t:.3f}" if need_bound else "-"), flush=True)
        sys.exit(0)
print(f"thousand_replicas.sh: the watch ended with {len(seen)} pods seen, {len(bound)} bound", file=sys.stderr)
# Created but not bound: report what was measured.
if created is not None:
    print(f"{created:.3f} unbound", flush=True)
else:
    sys.exit(1)
' "$N" "$need_bound" "$t0"
}
# One pod asked for (limit=1), not the whole list: at 10,000 pods a list per second is the API server's main load.
wait_gone() {
  local ns=$1 sel=$2 i
  for i in $(seq 1 600); do
    k get --raw "/api/v1/namespaces/$ns/pods?labelSelector=$sel&limit=1" 2>/dev/null | grep -q '"items":\[\]' &&
      return 0
    sleep 1
  done
  echo "thousand_replicas.sh: pods of $sel still exist after 600 s" >&2
  return 1
}

k apply -f "$REPO_ROOT/deploy/crds/trainingjobs.railyard.dev.yaml" >/dev/null
k wait --for=condition=Established --timeout=60s crd/trainingjobs.railyard.dev >/dev/null
k create namespace bench-job >/dev/null
if [ "$NODES" -gt 0 ]; then
t_nodes=$SECONDS
while :; do
  ready=$(k get nodes --no-headers 2>/dev/null | grep -c ' Ready ' || true)
  [ "$ready" -ge "$NODES" ] && break
  kill -0 "$NODE_AGENT_PID" 2>/dev/null || { echo "thousand_replicas.sh: the node agent exited:" >&2; tail -5 "$WORK/node-agent.log" >&2; exit 1; }
  [ $((SECONDS - t_nodes)) -lt $((900 + NODES / 10)) ] || { echo "thousand_replicas.sh: only $ready of $NODES nodes Ready after $((SECONDS - t_nodes)) s" >&2; tail -5 "$WORK/node-agent.log" >&2; exit 1; }
  sleep 5
done
echo "nodes ready: $ready (registered in $((SECONDS - t_nodes)) s)"
# The API server taints every new node node.kubernetes.io/not-ready:NoSchedule (TaintNodesByCondition) and the node
# controller lifts it once it sees Ready, through the controller manager's client limit (200 QPS here; at Kubernetes'
# default 20, 1,000 nodes took 203 s): until then the gang does not fit.
t_taints=$SECONDS
while :; do
  tainted=$(k get nodes -o jsonpath='{range .items[*]}{.spec.taints[*].key}{"\n"}{end}' 2>/dev/null | grep -c not-ready || true)
  [ "$tainted" = 0 ] && break
  [ $((SECONDS - t_taints)) -lt 900 ] || { echo "thousand_replicas.sh: $tainted nodes still tainted not-ready after 900 s" >&2; exit 1; }
  sleep 5
done
echo "nodes untainted: $((SECONDS - t_taints)) s more; $(k get nodes --no-headers | grep -c ' Ready ') Ready"
fi

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
# Between runs, outside the timing: deletecollection (one request) with grace 0, rather than the garbage collector's 20
# deletes per second and the node agent's graceful stop of 1,000 processes one pod at a time (4 minutes here); the
# node agent still stops the processes, and the next run waits until it has (settle).
# The request can outlast its 34 s timeout on a slow API server (1,000 deletes, one by one); the deletion goes on and
# wait_gone waits for it.
# Since 2026-12-07 the deletes are sent by 32 threads, one pod each: the API server runs a deletecollection one pod at
# a time (--delete-collection-workers 1), about 25 a second with 10,000 pods, so one 10,000-pod run took 7 minutes to
# clean up. A pod already gone counts as deleted.
API_SERVER=$(k config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')
API_TOKEN=$(k config view --raw --minify -o jsonpath='{.users[0].user.token}')
k config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}' | base64 -d >"$WORK/api-ca.crt"
delete_pods() {
  k get pods -n "$1" -l "$2" -o name 2>/dev/null | sed 's|^pod/||' |
    TOKEN="$API_TOKEN" python3 -c '
import http.client, os, ssl, sys, threading, urllib.parse
server, ns, ca = sys.argv[1], sys.argv[2], sys.argv[3]
u = urllib.parse.urlparse(server)
ctx = ssl.create_default_context(cafile=ca)
names, lock, failed = [l.strip() for l in sys.stdin if l.strip()], threading.Lock(), []
def work():
    c = http.client.HTTPSConnection(u.hostname, u.port, context=ctx, timeout=60)
    while True:
        with lock:
            if not names:
                return
            n = names.pop()
        c.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{n}?gracePeriodSeconds=0",
                  headers={"Authorization": "Bearer " + os.environ["TOKEN"]})
        r = c.getresponse()
        r.read()
        if r.status not in (200, 202, 404):
            failed.append(f"{n}: HTTP {r.status}")
threads = [threading.Thread(target=work) for _ in range(32)]
[t.start() for t in threads]
[t.join() for t in threads]
if failed:
    print(f"thousand_replicas.sh: {len(failed)} deletes failed, e.g. {failed[0]}", file=sys.stderr)
' "$API_SERVER" "$1" "$WORK/api-ca.crt" || true
}
# The next run also waits for the node agent to go idle (its log still for 5 s, at most 5 minutes): after a paused run
# it works through 1,000 stale pod events, and until 2026-11-29 that backlog ran into the next rounds.
settle() {
  local i size
  for i in $(seq 1 $((N > 1000 ? N / 10 : 120))); do
    [ "$(pgrep -c -f '^/bin/sleep 3600' || true)" = 0 ] && break
    sleep 1
  done
  if [ "$NODES" -gt 0 ]; then
    for i in $(seq 1 60); do
      size=$(stat -c %s "$WORK/node-agent.log")
      sleep 5
      [ "$(stat -c %s "$WORK/node-agent.log")" = "$size" ] && break
    done
  fi
  sleep 10
}

# --- The operator: one TrainingJob of N replicas (one pod per node), placed and bound as a gang.
# run_operator LABEL QPS BURST NS
run_operator() {
  local label=$1 qps=$2 burst=$3 ns=$4
  k create namespace "$ns" >/dev/null
  local args=${OPERATOR_ARGS:-}
  [ "$label" = "equal, B" ] && args=$OPERATOR_ARGS_B
  local pause=""
  [ "$label" = "equal, nodes paused" ] && pause=${NODE_AGENT_PID:-}
  # shellcheck disable=SC2086 # the args are a list of flags
  "$BIN/railyard-operator" --namespace "$ns" --leader-elect=false --worker-command /bin/sleep \
    --kube-api-qps "$qps" --kube-api-burst "$burst" $args \
    --metrics-addr "127.0.0.1:$(free_port)" --health-addr "127.0.0.1:$(free_port)" --rendezvous-bind 127.0.0.1:0 \
    >"$WORK/operator-$ns.log" 2>&1 &
  local op=$!
  pids+=("$op")
  sleep 2
  kill -0 "$op" || { cat "$WORK/operator-$ns.log" >&2; exit 1; }
  sed "s/namespace: bench-op/namespace: $ns/" "$WORK/tj.yaml" >"$WORK/tj-$ns.yaml"
  local cpu0 t0 op_created op_bound op_cpu op_rss perf=""
  if [ -n "${PERF_OUT:-}" ]; then
    perf record -q -F 999 -g -p "$op" -o "$PERF_OUT.$ns" >/dev/null 2>&1 &
    perf=$!
    sleep 1
  fi
  cpu0=$(cpu_seconds "$op")
  local plane0
  plane0=$(plane_cpu)
  echo "load average before ($label): $(loadavg)"
  # Leases are renewed every 10 s against a 40 s grace: a pause of a few seconds leaves every node Ready.
  [ -z "$pause" ] || kill -STOP "$pause"
  t0=$(now)
  k apply -f "$WORK/tj-$ns.yaml" >/dev/null
  read -r op_created op_bound < <(wait_pods "$ns" railyard.dev/job=big $([ "$NODES" -gt 0 ] && echo yes || echo no) "$t0" "${BIND_LIMIT:-$((600 + N / 10))}")
  [ -z "$pause" ] || kill -CONT "$pause"
  op_cpu=$(echo "$(cpu_seconds "$op") - $cpu0" | bc)
  where_cpu "$plane0"
  op_rss=$(peak_rss_mib "$op")
  [ -z "$perf" ] || { kill -INT "$perf"; wait "$perf" 2>/dev/null || true; }
  echo "operator ($label, qps $qps burst $burst): $N pods created in ${op_created} s, all bound in ${op_bound} s; operator CPU ${op_cpu} s, peak RSS ${op_rss} MiB; load average $(loadavg)"
  echo "row operator|$label|$op_created|$op_bound|$op_cpu|$op_rss|$N" >>"$WORK/rows"
  [ "$label" = "default client limits" ] && OP_CREATED_DEFAULT=$op_created
  [ "$label" = "equal: effectively unthrottled" ] && OP_CREATED_EQUAL=$op_created
  if [ -n "${JC_OUR_PODS:-}" ] && [ ! -s "$WORK/our-pod.json" ]; then
    k get pod big-worker-0 -n "$ns" -o json >"$WORK/our-pod.json"
  fi
  kill "$op"; wait "$op" 2>/dev/null || true
  k delete tj big -n "$ns" --wait=false >/dev/null
  delete_pods "$ns" railyard.dev/job=big
  wait_gone "$ns" railyard.dev/job=big
  settle
}
# write_tj: the TrainingJob of the current size N.
write_tj() {
cat >"$WORK/tj.yaml" <<TJ
apiVersion: railyard.dev/v1alpha1
kind: TrainingJob
metadata: {name: big, namespace: bench-op}
spec:
  replicas: $N
  procsPerReplica: 1
  device: cuda
  model: {preset: tiny}
  data: {train: /nonexistent/train_*.bin}
  training: {steps: 1, globalBatch: $N, microBatch: 1, seqLen: 64}
  parallelism: {data: $N}
  template:
    spec:
      containers:
      - name: worker
        command: ["/bin/sleep", "3600"]
TJ
}

# our_pods_job NAME: a Job whose pod template is the operator's saved worker pod (JC_OUR_PODS), as JSON.
our_pods_job() {
  python3 - "$WORK/our-pod.json" "$1" "$N" <<'PY'
import json, sys
pod, name, n = json.load(open(sys.argv[1])), sys.argv[2], int(sys.argv[3])
spec = pod["spec"]
# priority is the Priority admission plugin's to set from the class; the rest places or names one pod
for k in ("nodeName", "hostname", "subdomain", "priority", "preemptionPolicy"):
    spec.pop(k, None)
spec["schedulerName"] = "default-scheduler"  # the Job's pods stay unbound: no scheduler runs here
meta = {"labels": {"bench": name}, "annotations": pod["metadata"].get("annotations", {})}
print(json.dumps({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
                  "spec": {"parallelism": n, "completions": n, "backoffLimit": 0,
                           "template": {"metadata": meta, "spec": spec}}}))
PY
}

# --- The Job controller (kube-controller-manager --controllers=job) with the admin credentials the operator used.
run_job_controller() {
  local label=$1 qps=$2 burst=$3 name=$4
  "$CACHE_BIN/kube-controller-manager" --kubeconfig "$KUBECONFIG" --controllers job --leader-elect=false \
    --bind-address 127.0.0.1 --secure-port "$(free_port)" --port 0 --kube-api-qps "$qps" --kube-api-burst "$burst" \
    >"$WORK/kcm-$name.log" 2>&1 &
  local kcm=$!
  pids+=("$kcm")
  sleep 3
  kill -0 "$kcm" || { cat "$WORK/kcm-$name.log" >&2; exit 1; }
  local c0 t1 jc jb
  [ "$label" != "equal, our pods" ] || our_pods_job "$name" >"$WORK/job-our-pods-$name.json"
  c0=$(cpu_seconds "$kcm")
  local plane0
  plane0=$(plane_cpu)
  t1=$(now)
  if [ "$label" = "equal, our pods" ]; then
    k create -n bench-job -f "$WORK/job-our-pods-$name.json" >/dev/null
  else
  k create -n bench-job -f - >/dev/null <<JOB
apiVersion: batch/v1
kind: Job
metadata: {name: $name}
spec:
  parallelism: $N
  completions: $N
  backoffLimit: 0
  template:
    metadata: {labels: {bench: $name}}
    spec:
      restartPolicy: Never
      containers:
      - {name: worker, image: railyard-worker:local, command: ["/bin/sleep", "3600"]}
JOB
  fi
  echo "load average before (job controller, $label): $(loadavg)"
  read -r jc jb < <(wait_pods bench-job "bench=$name" no "$t1" $((900 + N / 10)))
  local jcpu
  jcpu=$(echo "$(cpu_seconds "$kcm") - $c0" | bc)
  where_cpu "$plane0"
  echo "job controller ($label, qps $qps burst $burst): $N pods created in ${jc} s; CPU $jcpu s, peak RSS $(peak_rss_mib "$kcm") MiB (whole kube-controller-manager); load average $(loadavg)"
  echo "row job|$label|$jc|-|$jcpu|$(peak_rss_mib "$kcm")|$N" >>"$WORK/rows"
  local op_created=${OP_CREATED_DEFAULT:-}
  [ "$label" = "default client limits" ] || op_created=$OP_CREATED_EQUAL
  echo "ratio ($label): job controller / operator (pods created) = $(echo "scale=2; $jc / $op_created" | bc)"
  kill "$kcm"; wait "$kcm" 2>/dev/null || true
  k delete job "$name" -n bench-job --cascade=background --wait=false >/dev/null 2>&1 || k delete job "$name" -n bench-job --wait=false >/dev/null
  delete_pods bench-job "bench=$name"
  wait_gone bench-job "bench=$name"
}
# Alternating rounds on the one cluster (namespaces and Job names per round and size, since a deleted namespace takes a
# while to go); each round runs every size in the order given, the operator's runs first in odd rounds and the Job
# controller's first in even ones (A-B, then B-A: a drift of the machine during a round favours neither side).
operator_runs() {
  [ -n "${ONLY_EQUAL:-}" ] || run_operator "default client limits" 50 1000 "bench-op-$r"
  run_operator "equal: effectively unthrottled" 1000 2000 "bench-op-equal-$r"
  [ -z "${OPERATOR_ARGS_B:-}" ] || run_operator "equal, B" 1000 2000 "bench-op-b-$r"
  [ -z "${PAUSE_NODES:-}" ] || [ "$NODES" = 0 ] || run_operator "equal, nodes paused" 1000 2000 "bench-op-p-$r"
}
job_controller_runs() {
  [ -n "${ONLY_EQUAL:-}" ] || run_job_controller "default client limits" 20 30 "default-limits-$r"
  run_job_controller "equal: effectively unthrottled" 1000 2000 "equal-limits-$r"
  [ -z "${JC_OUR_PODS:-}" ] || run_job_controller "equal, our pods" 1000 2000 "our-pods-$r"
}
for round in $(seq 1 "${ROUNDS:-1}"); do
  for N in "${SIZE_LIST[@]}"; do
    echo "--- round $round, $N replicas ($([ $((round % 2)) = 1 ] && echo "operator first" || echo "Job controller first"))"
    write_tj
    r=r$round-n$N
    if [ $((round % 2)) = 1 ]; then
      operator_runs
      job_controller_runs
    else
      job_controller_runs
      operator_runs
    fi
  done
done
# Medians (min-max) over the rounds, and the issue's ratios per round: operator bound / Job controller created, and
# CPU operator / Job controller, at equal limits.
python3 - "$WORK/rows" <<'PY'
import statistics, sys
all_rows = [l.split("|") for l in open(sys.argv[1]).read().split("\n") if l.startswith("row ")]
def col(who, label, i):
    return [float(r[i]) for r in rows if r[0] == "row " + who and r[1] == label and r[i] not in ("-", "unbound")]
def show(name, v):
    if v:
        print(f"{name}: median {statistics.median(v):.2f} (min {min(v):.2f}, max {max(v):.2f}, n {len(v)})")
def med(v):
    return statistics.median(v) if v else float("nan")
sizes = sorted({int(r[6]) for r in all_rows})
curve = []
for size in sizes:
  rows = [r for r in all_rows if int(r[6]) == size]
  print(f"=== {size} replicas")
  for label in sorted({r[1] for r in rows}):
      for who in ("operator", "job"):
          for i, what in ((2, "created s"), (3, "bound s"), (4, "CPU s")):
              show(f"{who} [{label}] {what}", col(who, label, i))
      # B and the paused-nodes runs are at equal limits too
      jlabel = "equal: effectively unthrottled" if label in ("equal, B", "equal, nodes paused") else label
      ob, jc = col("operator", label, 3), col("job", jlabel, 2)
      oc, jcpu = col("operator", label, 4), col("job", jlabel, 4)
      if ob and jc and len(ob) == len(jc):
          show(f"ratio [{label}] operator bound / job controller created", [a / b for a, b in zip(ob, jc)])
      if oc and jcpu and len(oc) == len(jcpu):
          show(f"ratio [{label}] operator CPU / job controller CPU", [a / b for a, b in zip(oc, jcpu)])
  # JC_OUR_PODS: what the operator's pods cost the Job controller against its own bare ones, and the operator against
  # the Job controller creating the same pods.
  ours, bare = col("job", "equal, our pods", 2), col("job", "equal: effectively unthrottled", 2)
  if ours and len(ours) == len(bare):
      show("ratio job controller: our pods / its bare pods (created)", [a / b for a, b in zip(ours, bare)])
      for label in ("equal: effectively unthrottled", "equal, nodes paused"):
          ob = col("operator", label, 3)
          if len(ob) == len(ours):
              show(f"ratio [{label}] operator bound / job controller creating our pods", [a / b for a, b in zip(ob, ours)])
  eq = "equal: effectively unthrottled"
  curve.append((size, med(col("operator", eq, 3)), med(col("job", eq, 2)), med(col("operator", eq, 4)),
                med(col("operator", eq, 5)), med(col("job", eq, 4))))
# The scaling curve at equal limits: medians per size; per 1,000 pods, so that linear growth reads as a flat column.
if len(curve) > 1:
    print("=== curve (equal limits, medians): replicas | operator bound s | job controller created s | ratio | "
          "operator CPU s | CPU s per 1,000 pods | operator peak RSS MiB | RSS MiB per 1,000 pods | job controller CPU s")
    for size, ob, jc, cpu, rss, jcpu in curve:
        print(f"{size} | {ob:.2f} | {jc:.2f} | {ob / jc:.2f} | {cpu:.2f} | {cpu / size * 1000:.3f} | {rss:.0f} | "
              f"{rss / size * 1000:.1f} | {jcpu:.2f}")
PY
