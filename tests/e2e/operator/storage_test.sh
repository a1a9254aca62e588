#!/usr/bin/env bash
# E2E: spec.storage (docs/storage.md) against the shared local cluster's real API server and controller manager (the
# garbage collector, the volume binder, pvc-protection). The pods run a shell command on simulated nodes, which mount
# nothing: what is checked is the claim the operator makes and keeps, which the real-node test then mounts for real
# (tests/e2e/real/install_test.sh step 3c). In order:
#   1. a job with spec.storage gets <job>-storage: its size, class, access mode and labels, the job its controller,
#      mounted in every pod at mountPath; event StorageCreated; the job runs;
#   2. a class that binds WaitForFirstConsumer: the operator, placing the gang itself, names the node of pod 0 on the
#      claim (what kube-scheduler does);
#   3. someone else's claim under the job's claim name: no pods, Warning StorageConflict, the claim untouched; labelled
#      as the job's storage it is taken (StorageReused), owned under whenDeleted Delete, and the pods come;
#   4. whenDeleted Retain: the claim has no owner and outlives the job; a new job of the name reuses it
#      (StorageReused); switched to Delete on the running job, the job owns it and the garbage collector deletes it
#      with the job;
#   5. runPolicy.suspend while the initializer pod is at work (Pending here: no kube-scheduler) deletes it, the
#      attempt not counted; resumed, a new initializer pod is attempt 1, with no InitializerLost event.
set -euo pipefail
# shellcheck source=../lib/cluster_env.sh
source "${RAILYARD_SOURCE_DIR:?}/tests/e2e/lib/cluster_env.sh" op-storage
op_pid=""
fail() {
  echo "FAIL: $*" >&2
  kubectl get tj,pods,pvc -n "$ns" -o wide >&2 || true
  kubectl get pvc -n "$ns" -o yaml >&2 || true
  kubectl get events -n "$ns" >&2 || true
  tail -n 40 "$work/op.log" >&2 || true
  exit 1
}
cleanup() {
  if [ -n "$op_pid" ]; then kill "$op_pid" 2>/dev/null || true; wait "$op_pid" 2>/dev/null || true; fi
  kubectl delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
  kubectl delete storageclass "railyard-e2e-none-$$" "railyard-e2e-wffc-$$" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=../lib/job_manifest.sh
source "$src/tests/e2e/lib/job_manifest.sh"
none=railyard-e2e-none-$$ wffc=railyard-e2e-wffc-$$
# job NAME COMMAND STORAGE-FLOW-MAPPING [job_manifest key=value ...]
job() { job_manifest "$1" command="$2" maxRestarts=3 extra="  storage: $3" "${@:4}"; }
pvc() { kubectl get pvc "$1" -n "$ns" -o json 2>/dev/null; }
job_uid() { kubectl get tj "$1" -n "$ns" -o jsonpath='{.metadata.uid}'; }
owner_uids() { pvc "$1" | jq -r '[.metadata.ownerReferences // [] | .[] | select(.kind == "TrainingJob") | .uid] | join(",")'; }
event() { # JOB REASON TEXT: an event of JOB with REASON whose message contains TEXT
  kubectl get events -n "$ns" --field-selector "involvedObject.name=$1,reason=$2" \
    -o jsonpath='{range .items[*]}{.message}{"\n"}{end}' | grep -qF "$3"
}
phase_is() { [ "$(kubectl get tj "$1" -n "$ns" -o jsonpath='{.status.phase}' 2>/dev/null)" = "$2" ]; }
pods_of() { kubectl get pods -n "$ns" -l "railyard.dev/job=$1" -o name | wc -l; }

install_crd "$src"
kubectl create namespace "$ns" >/dev/null
kubectl apply -f - >/dev/null <<EOT
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $none}
provisioner: example.com/nobody
volumeBindingMode: Immediate
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: $wffc}
provisioner: example.com/nobody
volumeBindingMode: WaitForFirstConsumer
EOT
wait_for 60 "the default service account token" \
  bash -c "kubectl get sa default -n $ns -o jsonpath='{.secrets[0].name}' | grep -q ."
"$bin/railyard-operator" --namespace "$ns" --leader-elect=false --metrics-addr 127.0.0.1:0 \
  --health-addr 127.0.0.1:0 --rendezvous-bind 127.0.0.1:0 >"$work/op.log" 2>&1 &
op_pid=$!

# --- 1. the claim, owned and mounted ------------------------------------------------------------------------
job st "exit 0" "{size: 3Gi, storageClassName: $none, mountPath: /ckpt}" replicas=2 |
  kubectl apply -n "$ns" -f - >/dev/null
wait_for 30 "claim st-storage" pvc st-storage
c=$(pvc st-storage)
[ "$(jq -r '.spec.resources.requests.storage' <<<"$c")" = 3Gi ] || fail "st-storage size: $(jq -c .spec <<<"$c")"
[ "$(jq -r '.spec.storageClassName' <<<"$c")" = "$none" ] || fail "st-storage class: $(jq -c .spec <<<"$c")"
[ "$(jq -c '.spec.accessModes' <<<"$c")" = '["ReadWriteMany"]' ] || fail "st-storage modes: $(jq -c .spec <<<"$c")"
[ "$(jq -r '.metadata.labels["railyard.dev/job"] + "/" + .metadata.labels["railyard.dev/storage"]' <<<"$c")" = st/true ] ||
  fail "st-storage labels: $(jq -c .metadata.labels <<<"$c")"
[ "$(owner_uids st-storage)" = "$(job_uid st)" ] || fail "st-storage owners '$(owner_uids st-storage)', want the job $(job_uid st)"
[ "$(jq -r '.metadata.ownerReferences[0].controller' <<<"$c")" = true ] || fail "the job is not the claim's controller"
wait_for 30 "event StorageCreated" event st StorageCreated "PersistentVolumeClaim $ns/st-storage (3Gi, class $none"
wait_for 30 "st's 2 pods" sh -c "[ \$(kubectl get pods -n $ns -l railyard.dev/job=st -o name | wc -l) = 2 ]"
for p in st-worker-0 st-worker-1; do
  kubectl get pod "$p" -n "$ns" -o json | jq -e '(.spec.volumes[] | select(.name == "railyard-storage")
      | .persistentVolumeClaim.claimName == "st-storage")
    and ([.spec.containers[0].volumeMounts[] | select(.name == "railyard-storage" and .mountPath == "/ckpt")] | length == 1)' \
    >/dev/null || fail "$p does not mount st-storage at /ckpt"
done
wait_for 60 "st Succeeded" phase_is st Succeeded
echo "1. st-storage made as asked, owned by st, mounted at /ckpt in both pods; st Succeeded"

# --- 2. WaitForFirstConsumer: the gang's node named on the claim ------------------------------------------------
job wf "sleep 300" "{size: 1Gi, storageClassName: $wffc}" | kubectl apply -n "$ns" -f - >/dev/null
selected() { pvc wf-storage | jq -r '.metadata.annotations["volume.kubernetes.io/selected-node"] // ""'; }
wait_for 30 "the node selected on wf-storage" sh -c "[ -n \"\$(kubectl get pvc wf-storage -n $ns -o jsonpath='{.metadata.annotations.volume\.kubernetes\.io/selected-node}')\" ]"
wait_for 30 "wf-worker-0 bound" sh -c "[ -n \"\$(kubectl get pod wf-worker-0 -n $ns -o jsonpath='{.spec.nodeName}')\" ]"
node0=$(kubectl get pod wf-worker-0 -n "$ns" -o jsonpath='{.spec.nodeName}')
[ "$(selected)" = "$node0" ] || fail "wf-storage selected node '$(selected)', want wf-worker-0's node $node0"
kubectl delete tj wf -n "$ns" --wait=false >/dev/null
echo "2. WaitForFirstConsumer: wf-storage got wf-worker-0's node $node0"

# --- 3. someone else's claim, then handed over ------------------------------------------------------------------
kubectl apply -n "$ns" -f - >/dev/null <<EOT
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: fx-storage, labels: {team: data}}
spec: {accessModes: [ReadWriteMany], storageClassName: $none, resources: {requests: {storage: 5Gi}}}
EOT
job fx "exit 0" "{size: 1Gi, storageClassName: $none}" | kubectl apply -n "$ns" -f - >/dev/null
wait_for 30 "Warning StorageConflict" event fx StorageConflict "PersistentVolumeClaim $ns/fx-storage exists and is not this job's"
sleep 2
[ "$(pods_of fx)" = 0 ] || fail "fx has pods although its claim name is someone else's"
[ -z "$(owner_uids fx-storage)" ] || fail "the operator took fx-storage: owners $(owner_uids fx-storage)"
kubectl label pvc fx-storage -n "$ns" railyard.dev/job=fx railyard.dev/storage=true >/dev/null
wait_for 60 "event StorageReused" event fx StorageReused "reusing PersistentVolumeClaim $ns/fx-storage"
wait_for 30 "fx owning fx-storage (whenDeleted Delete)" sh -c "[ \"\$(kubectl get pvc fx-storage -n $ns -o jsonpath='{.metadata.ownerReferences[0].uid}')\" = $(job_uid fx) ]"
[ "$(pvc fx-storage | jq -r '.metadata.labels.team + "/" + .spec.resources.requests.storage')" = data/5Gi ] ||
  fail "fx-storage changed beyond its owner: $(pvc fx-storage | jq -c '[.metadata.labels, .spec.resources]')"
wait_for 60 "fx Succeeded" phase_is fx Succeeded
echo "3. fx waited on someone else's claim (no pods), then took it once labelled as its storage, and Succeeded"

# --- 4. Retain, reuse, then Delete with the job ------------------------------------------------------------------
job kp "exit 0" "{size: 1Gi, storageClassName: $none, whenDeleted: Retain}" | kubectl apply -n "$ns" -f - >/dev/null
wait_for 60 "kp Succeeded" phase_is kp Succeeded
[ -z "$(owner_uids kp-storage)" ] || fail "kp-storage is owned although whenDeleted is Retain: $(owner_uids kp-storage)"
first_uid=$(pvc kp-storage | jq -r .metadata.uid)
kubectl delete tj kp -n "$ns" >/dev/null
sleep 3
[ "$(pvc kp-storage | jq -r .metadata.uid)" = "$first_uid" ] || fail "kp-storage did not outlive its job (whenDeleted Retain)"
job kp "sleep 300" "{size: 1Gi, storageClassName: $none, whenDeleted: Retain}" | kubectl apply -n "$ns" -f - >/dev/null
wait_for 30 "event StorageReused for the new kp" event kp StorageReused "which an earlier job of this name retained"
wait_for 30 "kp's pod" sh -c "[ \$(kubectl get pods -n $ns -l railyard.dev/job=kp -o name | wc -l) = 1 ]"
[ "$(pvc kp-storage | jq -r .metadata.uid)" = "$first_uid" ] || fail "the new kp got a new claim, not the retained one"
kubectl patch tj kp -n "$ns" --type=merge -p '{"spec":{"storage":{"whenDeleted":"Delete"}}}' >/dev/null
wait_for 30 "kp owning kp-storage after whenDeleted Delete" sh -c "[ \"\$(kubectl get pvc kp-storage -n $ns -o jsonpath='{.metadata.ownerReferences[0].uid}')\" = $(job_uid kp) ]"
kubectl delete tj kp -n "$ns" --wait=false >/dev/null
gone() { ! kubectl get pvc kp-storage -n "$ns" >/dev/null 2>&1; }
wait_for 60 "the garbage collector deleting kp-storage with its job" gone
echo "4. Retain: kp-storage outlived kp and was reused by the next kp; switched to Delete, it went with the job"

# --- 5. suspend stops an initializer at work; resumed, it starts again without counting the stop -----------------
# Simulated nodes run no kube-scheduler, so the initializer pod (default-scheduler) stays Pending: at work.
job ini "exit 0" "{size: 1Gi, storageClassName: $none}"$'\n'"  initializer: {data: {sources: [/in/a.txt]}}" |
  kubectl apply -n "$ns" -f - >/dev/null
init_status() { kubectl get tj ini -n "$ns" -o jsonpath='{.status.initializer.phase}/{.status.initializer.attempts}'; }
wait_for 30 "ini's initializer pod" kubectl get pod ini-initializer -n "$ns"
wait_for 30 "ini's initializer Running, attempt 1" sh -c "[ \"\$(kubectl get tj ini -n $ns -o jsonpath='{.status.initializer.phase}/{.status.initializer.attempts}')\" = Running/1 ]"
first_pod=$(kubectl get pod ini-initializer -n "$ns" -o jsonpath='{.metadata.uid}')
kubectl patch tj ini -n "$ns" --type=merge -p '{"spec":{"runPolicy":{"suspend":true}}}' >/dev/null
wait_for 30 "ini Suspended" phase_is ini Suspended
wait_for 30 "ini-initializer deleted by the suspend" sh -c "! kubectl get pod ini-initializer -n $ns >/dev/null 2>&1 || [ -n \"\$(kubectl get pod ini-initializer -n $ns -o jsonpath='{.metadata.deletionTimestamp}')\" ]"
[ "$(init_status)" = Running/0 ] || fail "ini's initializer after the suspend: $(init_status) (want the stopped attempt not counted)"
kubectl delete pod ini-initializer -n "$ns" --force --grace-period=0 >/dev/null 2>&1 || true  # never bound: nothing to stop
kubectl patch tj ini -n "$ns" --type=merge -p '{"spec":{"runPolicy":{"suspend":false}}}' >/dev/null
wait_for 30 "a new ini-initializer after the resume" sh -c "u=\$(kubectl get pod ini-initializer -n $ns -o jsonpath='{.metadata.uid}' 2>/dev/null); [ -n \"\$u\" ] && [ \"\$u\" != $first_pod ]"
wait_for 30 "ini's initializer Running, attempt 1 again" sh -c "[ \"\$(kubectl get tj ini -n $ns -o jsonpath='{.status.initializer.phase}/{.status.initializer.attempts}')\" = Running/1 ]"
! event ini InitializerLost "" || fail "the suspend's deletion was reported as InitializerLost"
[ "$(pods_of ini)" = 1 ] || fail "ini has worker pods while its initializer has not finished: $(kubectl get pods -n "$ns" -l railyard.dev/job=ini -o name)"
kubectl delete tj ini -n "$ns" --wait=false >/dev/null
echo "5. suspend deleted ini's initializer pod at work and did not count the attempt; resumed, a new pod is attempt 1"
! grep -q "terminate called\|Segmentation" "$work/op.log" || fail "the operator crashed"
echo "PASS"
