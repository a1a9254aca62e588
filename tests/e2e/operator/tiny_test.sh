#!/usr/bin/env bash
# E2E: the tiny example trained for real. `railyard data prepare` makes shards, the operator (with
# `railyard-worker agent` as its worker command) creates and binds the pod, the agent joins the rendezvous and runs
# `railyard-worker train --config`, progress (step, loss) reaches the job's status, and the job ends Succeeded.
# Then the MoE example (deploy/examples/moe.yaml, #14): two pods with expert parallelism 2 and recomputation run to
# completion, and the pods' resolved config carries the family's fields; a job the worker would refuse is Invalid.
# Last, jobs the trainer itself refuses (missing data, an initFrom that is not a model, a model too big for memory, a
# vocabulary smaller than the data's tokens) fail saying why.
set -euo pipefail
# shellcheck source=../lib/cluster_env.sh
source "${RAILYARD_SOURCE_DIR:?}/tests/e2e/lib/cluster_env.sh" op-tiny-e2e
op_pid=""
fail() {
  echo "FAIL: $*" >&2
  kubectl get tj,pods -n "$ns" -o wide >&2 || true
  kubectl get tj tiny -n "$ns" -o jsonpath='{.status}' >&2 || true
  echo >&2
  tail -n 30 "$work/op.log" >&2
  for f in "$state"/node-agent/pods/"${ns}"_*/*.log; do [ -f "$f" ] && { echo "== $f" >&2; tail -n 20 "$f" >&2; }; done
  exit 1
}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
trap cleanup_operator_ns EXIT
jp() { kubectl get tj tiny -n "$ns" -o jsonpath="$1" 2>/dev/null; }

"$bin/railyard" data prepare --input /usr/share/common-licenses/* --output "$work/data" >/dev/null
install_crd "$src"
kubectl create namespace "$ns" >/dev/null
mport=$(free_port)
# A bad --api-parallelism is refused naming the flag; a small one still creates and binds the gang in batches.
out=$("$bin/railyard-operator" --api-parallelism 0 2>&1) && fail "--api-parallelism 0 was accepted"
grep -q -- "--api-parallelism '0': use 1 to 1024" <<<"$out" || fail "--api-parallelism 0: $out"
"$bin/railyard-operator" --namespace "$ns" --leader-elect=false --worker-command "$bin/railyard-worker" \
  --metrics-addr "127.0.0.1:$mport" --health-addr "127.0.0.1:$(free_port)" --rendezvous-bind 127.0.0.1:0 \
  --api-parallelism 1 >"$work/op.log" 2>&1 &
op_pid=$!

# The example as shipped, with its data paths pointed at this test's shards (its own volume and initializer left out:
# simulated nodes mount nothing; tests/e2e/real runs it unchanged).
sed -e "s|/shared/data/|$work/data/|g" -e "s|/shared/checkpoints/tiny|$work/ckpt|" \
  <(example_as_on_host tiny) | kubectl apply -n "$ns" -f - >/dev/null

saw_running=no
t0=$SECONDS
while :; do
  phase=$(jp '{.status.phase}')
  [ "$phase" = Running ] && saw_running=yes
  case "$phase" in Succeeded) break ;; Failed | Invalid) fail "job ended $phase" ;; esac
  [ $((SECONDS - t0)) -lt 300 ] || fail "not Succeeded after 300 s (phase '$phase')"
  sleep 1
done
echo "tiny example: Succeeded after $((SECONDS - t0)) s"
[ "$saw_running" = yes ] || fail "never observed phase Running"
[ "$(jp '{.status.progress}')" = "200/200" ] || fail "progress is '$(jp '{.status.progress}')', want 200/200"
loss=$(jp '{.status.loss}')
python3 -c "import sys; l=float(sys.argv[1]); sys.exit(0 if 0 < l < 4.0 else 1)" "$loss" ||
  fail "final loss '$loss' is not below 4.0 (ln 256 = 5.55 untrained)"
[ "$(jp '{.status.restarts}')" = 0 ] || fail "restarts: $(jp '{.status.restarts}')"
# (The pod itself may already be gone: cleanPodPolicy Running deletes the agent's pod once every rank is done.)
node=$(jp '{.status.placement.nodes[0]}')
[ -n "$node" ] || fail "no node in status.placement"
log=$(ls "$state"/node-agent/pods/"${ns}"_tiny-worker-0/*.log | head -1)
grep -q "step=200/200" "$log" || fail "the trainer's log has no step 200/200"
# status.loss is the last step's loss: the agent forwards the final progress before the worker's exit.
last_loss=$(grep -o 'step=200/200 loss=[0-9.]*' "$log" | tail -1 | sed 's/.*loss=//')
python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(a - b) <= 1e-5 * abs(b) else 1)" \
  "$loss" "$last_loss" || fail "status.loss $loss is not the last step's loss $last_loss"
echo "tiny example e2e: ok (node $node, final loss $loss)"
# Stable names: the job's headless Service <job>, owned by it, over its pods, publishing them before readiness.
svc=$(kubectl get service tiny -n "$ns" -o json) || fail "no Service tiny"
jq -e --arg uid "$(jp '{.metadata.uid}')" '.metadata.ownerReferences[0].uid == $uid
  and .metadata.ownerReferences[0].controller and .spec.clusterIP == "None" and .spec.publishNotReadyAddresses
  and .spec.selector == {"railyard.dev/job": "tiny"}' <<<"$svc" >/dev/null || fail "Service tiny is not the job's headless Service: $svc"

# Rendezvous over TLS (--rendezvous-tls auto, the default): the operator made its CA (Secret railyard-rendezvous-ca
# in the namespace it watches), gave the job's Secret the CA certificate, and the agent spoke HTTPS trusting only it.
ca_json=$(kubectl get secret railyard-rendezvous-ca -n "$ns" -o json) || fail "no CA Secret railyard-rendezvous-ca"
jq -r '.data["ca.crt"]' <<<"$ca_json" | base64 -d >"$work/ca.crt"
jq -e '.data["ca.key"] | length > 0' <<<"$ca_json" >/dev/null || fail "the CA Secret has no ca.key"
openssl x509 -in "$work/ca.crt" -noout -ext basicConstraints | grep -q "CA:TRUE" || fail "ca.crt is not a CA"
[ "$(kubectl get secret tiny-rendezvous -n "$ns" -o jsonpath='{.data.ca\.crt}' | base64 -d)" = "$(cat "$work/ca.crt")" ] ||
  fail "the job's Secret does not carry the operator's CA as ca.crt"
grep -q "tls=on" "$log" || fail "the agent did not speak TLS: $(grep -m1 'starting' "$log")"
rport=$(grep -o 'leading: reconciling.*rendezvous=[0-9.]*:[0-9]*' "$work/op.log" | head -1 | sed 's/.*://')
[ -n "$rport" ] || fail "no rendezvous address in the operator's log"
# With the CA the service answers (401: no token); without it, or over plain HTTP, no request gets through.
code=$(curl -s -o /dev/null -w '%{http_code}' --cacert "$work/ca.crt" -X POST -d '{}' "https://127.0.0.1:$rport/v1/status")
[ "$code" = 401 ] || fail "HTTPS with the CA answered '$code', want 401 (no token)"
rc=0
curl -s -o /dev/null -X POST -d '{}' "https://127.0.0.1:$rport/v1/status" || rc=$?
[ "$rc" = 60 ] || fail "HTTPS trusting only the system roots: curl exit $rc, want 60 (certificate not trusted)"
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -X POST -d '{}' "http://127.0.0.1:$rport/v1/status" || true)
[ "$code" != 401 ] && [ "${code#2}" = "$code" ] || fail "plain HTTP reached the service (HTTP $code)"
# The token is in the job's Secret and nowhere else that one can read: not in a log, not in a metric.
token=$(kubectl get secret tiny-rendezvous -n "$ns" -o jsonpath='{.data.token}' | base64 -d)
[ ${#token} = 64 ] || fail "the job's token is not 64 hex characters"
for f in "$work/op.log" "$state"/node-agent/pods/"${ns}"_*/*.log "$state"/node-agent/*.log; do
  [ -f "$f" ] || continue
  if grep -qF "$token" "$f"; then fail "the job's token appears in $f"; fi
done
curl -fsS "http://127.0.0.1:$mport/metrics" >"$work/op.metrics" || fail "no operator /metrics"
if grep -qF "$token" "$work/op.metrics"; then fail "the job's token appears in the operator's metrics"; fi
echo "rendezvous TLS: ok (CA in railyard-rendezvous-ca, client without it refused, token in no log or metric)"

# The job's NetworkPolicy (--network-policy ingress, the default), accepted by the API server and owned by the job:
# its pods, in every generation, accept the job's own pods and the metrics ports. (The local network enforces none.)
np=$(kubectl get networkpolicy tiny-workers -n "$ns" -o json) || fail "no NetworkPolicy tiny-workers"
uid=$(jp '{.metadata.uid}')
jq -e --arg uid "$uid" '.metadata.ownerReferences[0].uid == $uid and .metadata.ownerReferences[0].controller
  and .spec.podSelector.matchLabels["railyard.dev/job"] == "tiny" and .spec.policyTypes == ["Ingress"]
  and .spec.ingress[0].from[0].podSelector.matchLabels["railyard.dev/job"] == "tiny"
  and ([.spec.ingress[1].ports[].port] == [9400, 9399]) and (.spec.egress == null)' <<<"$np" >/dev/null ||
  fail "NetworkPolicy tiny-workers is not the job's ingress policy: $np"
# The operator restarted with --network-policy strict: the next job's policy also limits where its pods connect to.
# Its CA Secret deleted meanwhile (how the CA is rotated): the restarted operator makes a new CA for the next job.
kill "$op_pid" && wait "$op_pid" 2>/dev/null || true
kubectl delete secret railyard-rendezvous-ca -n "$ns" >/dev/null
"$bin/railyard-operator" --namespace "$ns" --leader-elect=false --worker-command "$bin/railyard-worker" \
  --metrics-addr "127.0.0.1:$(free_port)" --health-addr "127.0.0.1:$(free_port)" --rendezvous-bind 127.0.0.1:0 \
  --network-policy strict >>"$work/op.log" 2>&1 &
op_pid=$!

# The MoE example: expert parallelism 2 across the two pods, hierarchical all-to-all, full recomputation. TMPDIR
# (through the template) puts the agents' per-generation config.json where this test can read it.
t0=$SECONDS
# The example as shipped on this test's shards (its own volume and initializer left out: simulated nodes mount
# nothing), TMPDIR in a template of the test's own.
sed -e "s|/shared/data/|$work/data/|g" <(example_as_on_host moe) |
  python3 -c 'import sys, yaml; j = yaml.safe_load(sys.stdin); j["spec"]["template"] = {"spec": {"containers": [{"name": "worker", "env": [{"name": "TMPDIR", "value": sys.argv[1]}]}]}}; print(yaml.safe_dump(j))' "$work/tmp" |
  kubectl apply -n "$ns" -f - >/dev/null
mjp() { kubectl get tj moe -n "$ns" -o jsonpath="$1" 2>/dev/null; }
expert_seen=""
while :; do
  phase=$(mjp '{.status.phase}')
  [ -z "$expert_seen" ] && expert_seen=$(mjp '{.status.world.expert}')
  case "$phase" in Succeeded) break ;; Failed | Invalid) fail "moe job ended $phase: $(mjp '{.status.conditions}')" ;; esac
  [ $((SECONDS - t0)) -lt 240 ] || fail "moe job not Succeeded after 240 s (phase '$phase')"
  sleep 1
done
echo "moe example: Succeeded after $((SECONDS - t0)) s"
[ "$(mjp '{.status.progress}')" = "30/30" ] || fail "moe progress is '$(mjp '{.status.progress}')', want 30/30"
[ "$expert_seen" = 2 ] || fail "status.world.expert was '$expert_seen', want 2"
for i in 0 1; do
  cfg=$(ls "$work"/tmp/railyard-agent/"${ns}_moe_moe-worker-$i"/gen-*/config.json 2>/dev/null | head -1)
  [ -n "$cfg" ] || fail "no resolved config of moe-worker-$i under $work/tmp/railyard-agent"
  python3 - "$cfg" <<'EOT' || fail "moe-worker-$i's resolved config lacks the family's fields: $(cat "$cfg")"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["model"]["moe"] == {"experts": 4, "topK": 2, "capacityFactor": 2.0, "auxLossCoef": 0.01}, c["model"]
assert c["parallelism"]["expert"] == 2 and c["parallelism"]["expertAllToAll"] == "hierarchical", c["parallelism"]
assert c["memory"]["recompute"] == "full" and c["memory"]["offload"] == "none", c["memory"]
EOT
  log=$(ls "$state"/node-agent/pods/"${ns}"_moe-worker-$i/*.log | head -1)
  grep -q "ep=2 group" "$log" || fail "moe-worker-$i's trainer log shows no expert-parallel group"
  grep -q "hierarchical all_to_all over 2 = 2 nodes x 1 local ranks" "$log" || fail "moe-worker-$i: not hierarchical"
  grep -q "full (all layers)" "$log" || fail "moe-worker-$i: recomputation not on"
done
grep -q "step=30/30" "$(ls "$state"/node-agent/pods/"${ns}"_moe-worker-0/*.log | head -1)" ||
  fail "moe-worker-0's log has no step 30/30"
kubectl get secret railyard-rendezvous-ca -n "$ns" -o jsonpath='{.data.ca\.crt}' | base64 -d >"$work/ca2.crt"
! cmp -s "$work/ca.crt" "$work/ca2.crt" || fail "the restarted operator kept the deleted CA"
[ "$(kubectl get secret moe-rendezvous -n "$ns" -o jsonpath='{.data.ca\.crt}' | base64 -d)" = "$(cat "$work/ca2.crt")" ] ||
  fail "the moe job's Secret does not carry the new CA"
grep -q "tls=on" "$(ls "$state"/node-agent/pods/"${ns}"_moe-worker-0/*.log | head -1)" || fail "moe's agent did not speak TLS"
np=$(kubectl get networkpolicy moe-workers -n "$ns" -o json) || fail "no NetworkPolicy moe-workers"
# The restarted operator's rendezvous port (bound to port 0: the log says which).
rport=$(grep -o 'rendezvous=[0-9.]*:[0-9]*' "$work/op.log" | tail -1 | sed 's/.*://')
[ -n "$rport" ] || fail "no rendezvous address in the operator's log"
jq -e '.spec.policyTypes == ["Ingress", "Egress"]
  and .spec.egress[0].to[0].podSelector.matchLabels["railyard.dev/job"] == "moe"
  and (.spec.egress[1].ports[0].port | type) == "number"
  and .spec.egress[2].ports == [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]' <<<"$np" >/dev/null ||
  fail "NetworkPolicy moe-workers is not the strict policy: $np"
[ "$(jq '.spec.egress[1].ports[0].port' <<<"$np")" = "$rport" ] || fail "strict egress port is not the rendezvous port $rport: $np"
# Someone else's Secret, NetworkPolicy or Service under the name a job's would take is neither deleted nor ignored: a
# Warning event names it and the fix, and the job gets no pods until the name is free.
kubectl create secret generic taken-rendezvous -n "$ns" --from-literal=token=theirs >/dev/null
kubectl create service clusterip taken -n "$ns" --tcp=80:8080 >/dev/null
kubectl create -n "$ns" -f - >/dev/null <<'EOT'
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: taken-workers}
spec: {podSelector: {}, policyTypes: [Ingress]}
EOT
sed -e "s|name: tiny|name: taken|" -e "s|/shared/data/|$work/data/|g" -e "s|/shared/checkpoints/tiny|$work/ckpt-taken|" \
  <(example_as_on_host tiny) | kubectl apply -n "$ns" -f - >/dev/null
event() { kubectl get events -n "$ns" --field-selector "involvedObject.name=taken,reason=$1" -o name | grep -q .; }
no_pods() { [ -z "$(kubectl get pods -n "$ns" -l railyard.dev/job=taken -o name)" ]; }
# A change to the job brings the next reconcile forward (the failed ones back off).
touch_job() { kubectl annotate tj taken -n "$ns" "e2e-touch=$1" --overwrite >/dev/null; }
wait_for 30 "the RendezvousSecretConflict event on job taken" event RendezvousSecretConflict
no_pods || fail "job taken got pods beside a foreign Secret"
[ "$(kubectl get secret taken-rendezvous -n "$ns" -o jsonpath='{.data.token}' | base64 -d)" = theirs ] ||
  fail "the foreign Secret was changed"
kubectl delete secret taken-rendezvous -n "$ns" >/dev/null
touch_job 1
wait_for 30 "the NetworkPolicyConflict event on job taken" event NetworkPolicyConflict
no_pods || fail "job taken got pods beside a foreign policy"
if kubectl get networkpolicy taken-workers -n "$ns" -o jsonpath='{.metadata.ownerReferences}' | grep -q .; then
  fail "the foreign policy was taken over"
fi
kubectl delete networkpolicy taken-workers -n "$ns" >/dev/null
touch_job 2
wait_for 30 "the ServiceConflict event on job taken" event ServiceConflict
no_pods || fail "job taken got pods beside a foreign Service"
clusterip=$(kubectl get service taken -n "$ns" -o jsonpath='{.spec.clusterIP}')
[ -n "$clusterip" ] && [ "$clusterip" != None ] || fail "the foreign Service was changed (clusterIP '$clusterip')"
[ -z "$(kubectl get service taken -n "$ns" -o jsonpath='{.metadata.ownerReferences}')" ] ||
  fail "the foreign Service was taken over"
kubectl delete service taken -n "$ns" >/dev/null
touch_job 3
wait_for 60 "job taken's pod once the names are free" sh -c "kubectl get pods -n $ns -l railyard.dev/job=taken -o name | grep -q ."
[ "$(kubectl get pod taken-worker-0 -n "$ns" -o jsonpath='{.spec.hostname}/{.spec.subdomain}')" = taken-worker-0/taken ] ||
  fail "pod taken-worker-0 has no stable name: $(kubectl get pod taken-worker-0 -n "$ns" -o jsonpath='{.spec.hostname}/{.spec.subdomain}')"
# Level-triggered: the Service deleted by hand comes back (the operator's Service informer brings the job back).
first=$(kubectl get service taken -n "$ns" -o jsonpath='{.metadata.uid}') || fail "no Service taken"
kubectl delete service taken -n "$ns" >/dev/null
wait_for 30 "Service taken made again" sh -c "u=\$(kubectl get service taken -n $ns -o jsonpath='{.metadata.uid}' 2>/dev/null); [ -n \"\$u\" ] && [ \"\$u\" != $first ]"
[ "$(kubectl get service taken -n "$ns" -o jsonpath='{.spec.clusterIP}')" = None ] || fail "the remade Service is not headless"
kubectl delete tj taken -n "$ns" --wait=false >/dev/null
# ... and goes with its job (the garbage collector, through the owner reference).
wait_for 60 "Service taken deleted with its job" sh -c "! kubectl get service taken -n $ns >/dev/null 2>&1"

# What the worker refuses is refused up front: expert 3 divides neither the 4 experts nor the 2 data-parallel ranks.
sed -e "s|/shared/data/|$work/data/|g" -e "s|name: moe|name: moe-bad|" -e "s|expert: 2$|expert: 3|" \
  <(example_as_on_host moe) | kubectl apply -n "$ns" -f - >/dev/null
wait_for 30 "moe-bad Invalid" sh -c "[ \"\$(kubectl get tj moe-bad -n $ns -o jsonpath='{.status.phase}')\" = Invalid ]"
msg=$(kubectl get tj moe-bad -n "$ns" -o jsonpath='{.status.conditions[?(@.type=="Invalid")].message}')
case "$msg" in "spec.parallelism.expert: 3 does not divide the 4 experts"*) ;; *) fail "moe-bad message: '$msg'" ;; esac
echo "moe example e2e: ok (expert 2 hierarchical, recompute full; expert 3 Invalid)"

# A job the real trainer refuses says why in the trainer's own words (issue 40: "a failed job says why"): the worker's
# last stderr lines reach status.lastFailure.message. Two jobs at once: training data that is not there, and an
# initFrom file that is not a model. Both are the worker's exit 2 (a configuration error: permanent by default), so
# each fails at once, without restarts.
sed -e "s|name: tiny|name: nodata|" -e "s|/shared/data/train_|$work/nowhere/train_|" -e "s|/shared/data/|$work/data/|g" \
  -e "s|/shared/checkpoints/tiny|$work/ckpt-nodata|" <(example_as_on_host tiny) | kubectl apply -n "$ns" -f - >/dev/null
notmodel=$(ls "$work"/data/val_*.bin | head -1)  # a token shard, not an llm.c model file
sed -e "s|name: tiny|name: badinit|" -e "s|/shared/data/|$work/data/|g" -e "s|/shared/checkpoints/tiny|$work/ckpt-badinit|" \
  -e "s|    preset: tiny|    preset: tiny\n    initFrom: $notmodel|" <(example_as_on_host tiny) |
  kubectl apply -n "$ns" -f - >/dev/null
for j in nodata badinit; do
  wait_for 120 "job $j to fail" sh -c "[ \"\$(kubectl get tj $j -n $ns -o jsonpath='{.status.phase}')\" = Failed ]"
  [ "$(kubectl get tj $j -n "$ns" -o jsonpath='{.status.restarts}')" = 0 ] || fail "job $j restarted"
done
msg=$(kubectl get tj nodata -n "$ns" -o jsonpath='{.status.lastFailure.message}')
grep -qF "$work/nowhere/train_" <<<"$msg" || fail "nodata: lastFailure.message does not name the data path: '$msg'"
grep -q "exited with code 2: .*ERROR worker: spec.data.train (" <<<"${msg//$'\n'/ }" || fail "nodata: lastFailure.message: '$msg'"
msg2=$(kubectl get tj badinit -n "$ns" -o jsonpath='{.status.lastFailure.message}')
grep -qF "$notmodel" <<<"$msg2" || fail "badinit: lastFailure.message does not name the file: '$msg2'"
grep -q "exited with code 2: .*ERROR worker: spec.model.initFrom (.*not an llm.c GPT-2 checkpoint" <<<"${msg2//$'\n'/ }" ||
  fail "badinit: lastFailure.message: '$msg2'"
echo "the trainer's refusals reach status: nodata: $msg | badinit: $msg2"
# Two more the trainer refuses on its own: a model whose training state cannot fit in memory (about 360 GiB, so
# on any test machine), and a vocabulary smaller than the data's tokens (the test's English text is ASCII, bytes 10-126).
custom() { # NAME LAYERS HIDDEN HEADS VOCAB
  sed -e "s|name: tiny|name: $1|" -e "s|/shared/data/|$work/data/|g" -e "s|/shared/checkpoints/tiny|$work/ckpt-$1|" \
    -e "s|    preset: tiny|    preset: custom\n    layers: $2\n    hidden: $3\n    heads: $4\n    seqLen: 64\n    vocab: $5|" \
    <(example_as_on_host tiny) | kubectl apply -n "$ns" -f - >/dev/null
}
custom toobig 48 6400 50 50304
custom smallvocab 2 64 4 64
for j in toobig smallvocab; do
  wait_for 120 "job $j to fail" sh -c "[ \"\$(kubectl get tj $j -n $ns -o jsonpath='{.status.phase}')\" = Failed ]"
  [ "$(kubectl get tj $j -n "$ns" -o jsonpath='{.status.restarts}')" = 0 ] || fail "job $j restarted"
done
msg3=$(kubectl get tj toobig -n "$ns" -o jsonpath='{.status.lastFailure.message}')
grep -q "exited with code 2: .*spec.model/spec.training (--model/--batch/--seq): training needs [0-9.]* GiB per rank" <<<"${msg3//$'\n'/ }" ||
  fail "toobig: lastFailure.message: '$msg3'"
msg4=$(kubectl get tj smallvocab -n "$ns" -o jsonpath='{.status.lastFailure.message}')
grep -q "exited with code 2: .*token [0-9]* at byte offset [0-9]* is >= vocab size 64" <<<"${msg4//$'\n'/ }" ||
  fail "smallvocab: lastFailure.message: '$msg4'"
echo "too big and vocabulary mismatch reach status: toobig: $msg3 | smallvocab: $msg4"
