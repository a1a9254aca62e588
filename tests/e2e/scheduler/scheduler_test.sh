#!/usr/bin/env bash
# E2E: the operator's default rail-aware placement on the real local cluster (the fixture's 4 H100 nodes: units u0
# and u1 of 2 nodes each, one leaf). GPU-shaped jobs (device cuda, 8 GPUs a pod) run `sleep` from spec.template.
#  1. a 4-GPU pod takes a node; a 2-pod 8-GPU gang then lands whole in the other unit (first fit would split it);
#     status.placement.hops is 1, the Bound event explains the choice (with the cost model's predicted step),
#     /metrics has the hops histogram;
#  2. railyard.dev/exclude-nodes on the job moves its pod off the named node (restart reason NodeExcluded) and the
#     replacement never lands there;
#  3. a gang that does not fit waits Unschedulable with a message saying why, with none of its pods bound, and
#     starts once capacity returns, inside one unit (placement.mode hard, topologyKeys [unit]);
#  4. two gangs submitted at once land whole in separate units;
#  5. an extended resource (example.com/nic, advertised in 2, then 3 nodes' status): a 3-pod gang asking one per pod
#     waits naming it, none bound, then starts on exactly the nodes that have it;
#  6. PriorityClass order: of two gangs waiting for the same nodes, the higher-priority one (created later) gets them.
# Along the way, the rail-aligned NCCL env of GPU pods (docs/scheduler.md "NCCL settings"): every pod prints its
# NCCL_* env at start, as the node agent resolved it from the Binding's annotations: the default HCAs
# mlx5_0..mlx5_7 (1.), the nodes' railyard.dev/rail-hcas and nccl-socket-ifname annotations (1.), a Warning event
# and no HCA list for an invalid annotation (3.).
set -euo pipefail
# shellcheck source=../lib/cluster_env.sh
source "${RAILYARD_SOURCE_DIR:?}/tests/e2e/lib/cluster_env.sh" sched-e2e
op_pid=
fail() {
  echo "FAIL: $*" >&2
  kubectl get tj,pods -n "$ns" -o wide >&2 || true
  kubectl get tj -n "$ns" -o jsonpath='{range .items[*]}{.metadata.name}{": "}{.status}{"\n"}{end}' >&2 || true
  kubectl get events -n "$ns" --sort-by=.lastTimestamp >&2 || true
  echo "--- operator log (tail)" >&2
  tail -n 40 "$work/op.log" >&2 || true
  exit 1
}
unannotate_nodes() {
  for n in $(kubectl get nodes -l railyard.dev/simulated=true -o name); do
    kubectl annotate "$n" railyard.dev/rail-hcas- railyard.dev/nccl-socket-ifname- >/dev/null 2>&1 || true
  done
}
# shellcheck source=../operator/lib.sh
source "$src/tests/e2e/operator/lib.sh"
cleanup() {
  unannotate_nodes
  cleanup_operator_ns
}
trap cleanup EXIT

jp() { kubectl get tj "$1" -n "$ns" -o jsonpath="$2" 2>/dev/null; }
node_of() { kubectl get pod "$1" -n "$ns" -o jsonpath='{.spec.nodeName}' 2>/dev/null; }
unit_of() { kubectl get node "$1" -o jsonpath='{.metadata.labels.railyard\.dev/unit}'; }
pod_log() { cat "$state/node-agent/pods/${ns}_$1/worker.log" 2>/dev/null; }
# nccl_env POD: the NCCL_* lines the pod's process printed (waits for them)
nccl_env() {
  wait_for 30 "the NCCL env printed by $1" bash -c "grep -q '^NCCL_CROSS_NIC=' '$state/node-agent/pods/${ns}_$1/worker.log'"
  pod_log "$1" | grep '^NCCL_'
}
expect_nccl_env() { # expect_nccl_env POD EXPECTED-LINES
  local got
  got=$(nccl_env "$1")
  [ "$got" = "$2" ] || fail "NCCL env of $1: expected
$2
got
$got"
}
bound() { [ -n "$(node_of "$1")" ]; }
# shellcheck source=../lib/job_manifest.sh
source "$src/tests/e2e/lib/job_manifest.sh"
# job NAME REPLICAS PROCS [EXTRA-SPEC-YAML]: GPU pods that print their NCCL env and wait.
job() {
  job_manifest "$1" replicas="$2" procs="$3" device=cuda globalBatch=16 maxRestarts=5 extra="${4:-}" \
    command='env | grep ^NCCL_ | sort; exec sleep 600'
}

install_crd "$src"
kubectl create namespace "$ns" >/dev/null
nodes=$(kubectl get nodes -l railyard.dev/simulated=true -o name | wc -l)
[ "$nodes" -eq 4 ] || fail "expected the fixture's 4 simulated nodes, found $nodes"
mport=$(free_port)
"$bin/railyard-operator" --namespace "$ns" --leader-elect=false --metrics-addr "127.0.0.1:$mport" \
  --health-addr "127.0.0.1:$(free_port)" --rendezvous-bind 127.0.0.1:0 >"$work/op.log" 2>&1 &
op_pid=$!

# 1. Best fit: the half-node job fills a node; the 2-node gang goes whole into the unit it did not touch.
job half 1 4 | kubectl apply -n "$ns" -f - >/dev/null
wait_for 60 "half-worker-0 bound" bound half-worker-0
half_node=$(node_of half-worker-0)
expect_nccl_env half-worker-0 "NCCL_CROSS_NIC=0
NCCL_IB_HCA==mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7
NCCL_SOCKET_IFNAME="
[ "$(kubectl get pod half-worker-0 -n "$ns" -o jsonpath='{.metadata.annotations.railyard\.dev/nccl-ib-hca}')" = \
  "=mlx5_0,mlx5_1,mlx5_2,mlx5_3,mlx5_4,mlx5_5,mlx5_6,mlx5_7" ] || fail "half-worker-0 lacks the nccl-ib-hca annotation"
echo "NCCL env (default HCAs): $(nccl_env half-worker-0 | tr '\n' ' ')"
# The nodes name their HCAs (reversed, so the order visibly comes from the annotation) and a socket interface.
for n in $(kubectl get nodes -l railyard.dev/simulated=true -o name); do
  kubectl annotate --overwrite "$n" railyard.dev/rail-hcas=mlx5_7,mlx5_6,mlx5_5,mlx5_4,mlx5_3,mlx5_2,mlx5_1,mlx5_0 \
    railyard.dev/nccl-socket-ifname=lo >/dev/null
done
job pair 2 8 | kubectl apply -n "$ns" -f - >/dev/null
wait_for 60 "pair bound" bash -c "[ -n \"\$(kubectl get pod pair-worker-1 -n $ns -o jsonpath='{.spec.nodeName}')\" ] &&
  [ -n \"\$(kubectl get pod pair-worker-0 -n $ns -o jsonpath='{.spec.nodeName}')\" ]"
p0=$(node_of pair-worker-0)
p1=$(node_of pair-worker-1)
[ "$(unit_of "$p0")" = "$(unit_of "$p1")" ] || fail "pair split across units: $p0, $p1"
[ "$(unit_of "$p0")" != "$(unit_of "$half_node")" ] || fail "pair shares a unit with the half-full node $half_node"
wait_for 30 "status.placement.hops of pair" bash -c "[ \"\$(kubectl get tj pair -n $ns -o jsonpath='{.status.placement.hops}')\" = 1 ]"
events=$(kubectl get events -n "$ns" --field-selector involvedObject.name=pair,reason=Bound -o jsonpath='{.items[*].message}')
grep -q "rail-aware: unit $(unit_of "$p0"), 1 unit, same-rail hops worst 1" <<<"$events" ||
  fail "Bound event without the placement: $events"
# The operator passed the planner's cost model (H100 profile, tiny, dp 16): the candidates were scored by step time.
grep -q "predicted step [0-9.e+-]* s" <<<"$events" || fail "Bound event without the cost model's prediction: $events"
metrics=$(curl -sf "http://127.0.0.1:$mport/metrics") || fail "no /metrics"
grep -q '^railyard_operator_placement_hops_bucket{le="1"} 2$' <<<"$metrics" ||
  fail "railyard_operator_placement_hops does not show the two placements within one unit"
echo "best fit: half on $half_node; pair on $p0 + $p1 (unit $(unit_of "$p0")), hops 1"
for i in 0 1; do
  expect_nccl_env pair-worker-$i "NCCL_CROSS_NIC=0
NCCL_IB_HCA==mlx5_7,mlx5_6,mlx5_5,mlx5_4,mlx5_3,mlx5_2,mlx5_1,mlx5_0
NCCL_SOCKET_IFNAME=lo"
done
echo "NCCL env (annotated nodes): $(nccl_env pair-worker-0 | tr '\n' ' ')"

# 2. Exclusion: the node of pair-worker-1 is blamed; the pod moves off it and never comes back to it.
uid1=$(kubectl get pod pair-worker-1 -n "$ns" -o jsonpath='{.metadata.uid}')
kubectl annotate tj pair -n "$ns" "railyard.dev/exclude-nodes=$p1" >/dev/null
wait_for 60 "a replacement of pair-worker-1 bound" bash -c \
  "u=\$(kubectl get pod pair-worker-1 -n $ns -o jsonpath='{.metadata.uid}' 2>/dev/null); [ -n \"\$u\" ] && [ \"\$u\" != $uid1 ] &&
   [ -n \"\$(kubectl get pod pair-worker-1 -n $ns -o jsonpath='{.spec.nodeName}')\" ]"
r1=$(node_of pair-worker-1)
[ "$r1" != "$p1" ] || fail "the replacement landed on the excluded node $p1"
[ "$r1" != "$half_node" ] || fail "the replacement landed on $half_node, which has 4 free GPUs"
[ "$(node_of pair-worker-0)" = "$p0" ] || fail "pair-worker-0 moved"
[ "$(jp pair '{.status.lastRestart.reason}')" = NodeExcluded ] || fail "restart reason is not NodeExcluded"
wait_for 30 "hops 3 after the move" bash -c "[ \"\$(kubectl get tj pair -n $ns -o jsonpath='{.status.placement.hops}')\" = 3 ]"
echo "exclusion: pair-worker-1 moved $p1 -> $r1 (reason NodeExcluded), hops 3"

# 3. All or nothing: 2 more 8-GPU pods do not fit (only the node pair left is free); none is bound, the condition
# says why; deleting pair frees a whole unit and the hard-mode gang starts inside it.
job wait 2 8 "  placement: {mode: hard, topologyKeys: [railyard.dev/unit]}" | kubectl apply -n "$ns" -f - >/dev/null
wait_for 60 "wait Unschedulable" bash -c \
  "kubectl get tj wait -n $ns -o jsonpath='{.status.conditions[?(@.type==\"Scheduled\")].reason}' | grep -qx Unschedulable"
msg=$(jp wait '{.status.conditions[?(@.type=="Scheduled")].message}')
grep -q "needs 2 nodes with 8 free nvidia.com/gpu in one unit (placement.mode hard); 1 of 4 nodes fit, 3 without 8 free nvidia.com/gpu; none bound" <<<"$msg" ||
  fail "unexpected Unschedulable message: $msg"
for i in 0 1; do
  [ -z "$(node_of wait-worker-$i)" ] || fail "wait-worker-$i was bound while its gang does not fit"
done
echo "waiting: $msg"
for n in $(kubectl get nodes -l railyard.dev/simulated=true -o name); do
  kubectl annotate --overwrite "$n" railyard.dev/rail-hcas=mlx5_0 >/dev/null  # 1 HCA for 8 rails: invalid
done
kubectl delete tj pair -n "$ns" --wait=false >/dev/null
wait_for 90 "wait bound" bash -c "[ -n \"\$(kubectl get pod wait-worker-0 -n $ns -o jsonpath='{.spec.nodeName}')\" ] &&
  [ -n \"\$(kubectl get pod wait-worker-1 -n $ns -o jsonpath='{.spec.nodeName}')\" ]"
w0=$(node_of wait-worker-0)
w1=$(node_of wait-worker-1)
[ "$(unit_of "$w0")" = "$(unit_of "$w1")" ] || fail "hard-mode gang split across units: $w0, $w1"
echo "wait: started on $w0 + $w1 once pair was gone"
expect_nccl_env wait-worker-0 "NCCL_CROSS_NIC=0
NCCL_IB_HCA=
NCCL_SOCKET_IFNAME=lo"
warn=$(kubectl get events -n "$ns" --field-selector involvedObject.name=wait,reason=NodeRailHcas -o jsonpath='{.items[*].message}')
grep -q "railyard.dev/rail-hcas='mlx5_0': lists 1 HCAs but the node has 8 rails" <<<"$warn" ||
  fail "no NodeRailHcas warning for the invalid annotation: $warn"
unannotate_nodes

# 4. Two gangs submitted at once (reconciled by two workers at the same moment) land whole in separate units.
kubectl delete tj half wait -n "$ns" --wait=false >/dev/null
wait_for 90 "the pods of half and wait gone" bash -c "[ -z \"\$(kubectl get pods -n $ns -o name)\" ]"
{ job east 2 8; echo "---"; job west 2 8; } | kubectl apply -n "$ns" -f - >/dev/null
for j in east west; do
  wait_for 60 "$j bound" bash -c "[ -n \"\$(kubectl get pod $j-worker-0 -n $ns -o jsonpath='{.spec.nodeName}')\" ] &&
    [ -n \"\$(kubectl get pod $j-worker-1 -n $ns -o jsonpath='{.spec.nodeName}')\" ]"
done
e0=$(unit_of "$(node_of east-worker-0)") e1=$(unit_of "$(node_of east-worker-1)")
v0=$(unit_of "$(node_of west-worker-0)") v1=$(unit_of "$(node_of west-worker-1)")
[ "$e0" = "$e1" ] && [ "$v0" = "$v1" ] && [ "$e0" != "$v0" ] || fail "east ($e0, $e1) and west ($v0, $v1) are not whole in separate units"
echo "two at once: east in $e0, west in $v0"

# 5. An extended resource (issue #43 item 4): placement counts what kube-scheduler counts, here example.com/nic that
# nodes advertise in their status (as a device plugin or an admin would). A 3-pod gang asking one per pod waits while
# only 2 nodes have one, saying so, with no pod bound; a third node advertising one lets it start, on those 3 nodes.
kubectl delete tj east west -n "$ns" --wait=false >/dev/null
wait_for 90 "the pods of east and west gone" bash -c "[ -z \"\$(kubectl get pods -n $ns -o name)\" ]"
proxy_port=$(free_port)
kubectl proxy --port "$proxy_port" >"$work/proxy.log" 2>&1 &
proxy_pid=$!
wait_for 20 "kubectl proxy" curl -sf "http://127.0.0.1:$proxy_port/api"
nic() { # NODE add|remove: example.com/nic 1 in the node's capacity and allocatable (JSON patch of its status)
  local ops
  if [ "$2" = add ]; then
    ops='[{"op":"add","path":"/status/capacity/example.com~1nic","value":"1"},{"op":"add","path":"/status/allocatable/example.com~1nic","value":"1"}]'
  else
    ops='[{"op":"remove","path":"/status/capacity/example.com~1nic"},{"op":"remove","path":"/status/allocatable/example.com~1nic"}]'
  fi
  curl -sf -X PATCH -H 'Content-Type: application/json-patch+json' --data "$ops" \
    "http://127.0.0.1:$proxy_port/api/v1/nodes/$1/status" >/dev/null
}
mapfile -t sim < <(kubectl get nodes -l railyard.dev/simulated=true -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}' | sort)
nic_nodes=()
cleanup_nic() { for n in "${nic_nodes[@]}"; do nic "$n" remove || true; done; kill "$proxy_pid" 2>/dev/null || true; }
trap 'cleanup_nic; cleanup' EXIT
for n in "${sim[0]}" "${sim[1]}"; do nic "$n" add || fail "advertising example.com/nic on $n"; nic_nodes+=("$n"); done
job_manifest nics replicas=3 procs=1 device=cuda globalBatch=12 maxRestarts=5 command='exec sleep 600' \
  extra='  resources: {requests: {example.com/nic: "1"}, limits: {example.com/nic: "1"}}' | kubectl apply -n "$ns" -f - >/dev/null
# (The first evaluation may still count east's GPUs, gone a moment before; the condition is rewritten every 5 s.)
nic_msg() { jp nics '{.status.conditions[?(@.type=="Scheduled")].reason}/{.status.conditions[?(@.type=="Scheduled")].message}'; }
names_nic() { grep -q "^Unschedulable/.*2 without room for the pod's example.com/nic" <<<"$(nic_msg)"; }
wait_for 60 "nics Unschedulable, naming example.com/nic" names_nic || fail "nics waits with: $(nic_msg)"
msg=$(jp nics '{.status.conditions[?(@.type=="Scheduled")].message}')
for i in 0 1 2; do [ -z "$(node_of nics-worker-$i)" ] || fail "nics-worker-$i bound while only 2 nodes have a NIC"; done
echo "extended resource: waiting: $msg"
nic "${sim[2]}" add || fail "advertising example.com/nic on ${sim[2]}"
nic_nodes+=("${sim[2]}")
wait_for 60 "nics bound" bash -c "for i in 0 1 2; do [ -n \"\$(kubectl get pod nics-worker-\$i -n $ns -o jsonpath='{.spec.nodeName}')\" ] || exit 1; done"
got=$(for i in 0 1 2; do printf '%s\n' "$(node_of "nics-worker-$i")"; done | sort | tr '\n' ' ')
want=$(printf '%s\n' "${sim[0]}" "${sim[1]}" "${sim[2]}" | sort | tr '\n' ' ')
[ "$got" = "$want" ] || fail "nics placed on $got; the nodes with example.com/nic are $want"
echo "extended resource: started on $got(the 3 nodes advertising example.com/nic)"

# 6. PriorityClass order (issue #43 item 4): two gangs wait for the same 2 nodes; the one whose pods have the higher
# priority gets them although the other is older and is the one reconciled at the moment they free up (an annotation
# wakes it at once, while the high one waits for its 5 s retry): the low one books the high one first and keeps
# waiting. Without the order the low gang, reconciled first, would take the nodes.
kubectl delete tj nics -n "$ns" --wait=false >/dev/null
wait_for 90 "the pods of nics gone" bash -c "[ -z \"\$(kubectl get pods -n $ns -o name)\" ]"
pc=sched-e2e-high-$$
kubectl create priorityclass "$pc" --value=1000 --description="scheduler_test.sh case 6" >/dev/null
trap 'kubectl delete priorityclass "$pc" --wait=false >/dev/null 2>&1 || true; cleanup_nic; cleanup' EXIT
with_priority() { sed "/^    spec:\$/a\\      priorityClassName: $pc"; }
{ job fill-a 2 8; echo "---"; job fill-b 2 8; } | kubectl apply -n "$ns" -f - >/dev/null
for j in fill-a fill-b; do
  wait_for 60 "$j bound" bash -c "[ -n \"\$(kubectl get pod $j-worker-0 -n $ns -o jsonpath='{.spec.nodeName}')\" ] &&
    [ -n \"\$(kubectl get pod $j-worker-1 -n $ns -o jsonpath='{.spec.nodeName}')\" ]"
done
unschedulable() { [ "$(jp "$1" '{.status.conditions[?(@.type=="Scheduled")].reason}')" = Unschedulable ]; }
job low 2 8 | kubectl apply -n "$ns" -f - >/dev/null
wait_for 60 "low Unschedulable" unschedulable low
job high 2 8 | with_priority | kubectl apply -n "$ns" -f - >/dev/null
wait_for 60 "high Unschedulable" unschedulable high
kubectl delete tj fill-a -n "$ns" --wait=false >/dev/null
wait_for 90 "the pods of fill-a gone" bash -c "[ -z \"\$(kubectl get pods -n $ns -l railyard.dev/job=fill-a -o name)\" ]"
kubectl annotate tj low -n "$ns" --overwrite e2e/wake="$(date +%s%N)" >/dev/null
wait_for 60 "high bound" bash -c "[ -n \"\$(kubectl get pod high-worker-0 -n $ns -o jsonpath='{.spec.nodeName}')\" ] &&
  [ -n \"\$(kubectl get pod high-worker-1 -n $ns -o jsonpath='{.spec.nodeName}')\" ]"
[ "$(kubectl get pod high-worker-0 -n "$ns" -o jsonpath='{.spec.priority}')" = 1000 ] ||
  fail "high's pods do not carry the class's priority 1000"
sleep 6  # one more of low's retries: it must still find no room
for i in 0 1; do [ -z "$(node_of low-worker-$i)" ] || fail "low-worker-$i bound ahead of the higher-priority gang"; done
unschedulable low || fail "low is not Unschedulable after high took the nodes"
echo "priority: high (priority 1000, created after low) took the 2 free nodes; low waits: $(jp low '{.status.conditions[?(@.type=="Scheduled")].message}')"
# The low gang still starts when room returns.
kubectl delete tj fill-b -n "$ns" --wait=false >/dev/null
wait_for 90 "low bound" bash -c "[ -n \"\$(kubectl get pod low-worker-0 -n $ns -o jsonpath='{.spec.nodeName}')\" ] &&
  [ -n \"\$(kubectl get pod low-worker-1 -n $ns -o jsonpath='{.spec.nodeName}')\" ]"
echo "priority: low started once fill-b was gone"
echo "PASS"
