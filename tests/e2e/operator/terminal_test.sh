#!/usr/bin/env bash
# E2E: Succeeded and Failed are terminal (issue 24). A finished job that is scaled (to an invalid and to a valid
# size), edited and sent a restart request keeps its phase, conditions and status; no pod is created; each ignored
# request is reported in an IgnoredAfterFinish event. Regression: a `kubectl scale` of a Succeeded job turned it
# Invalid, and scaling it back opened a generation that ended Failed.
set -euo pipefail
# shellcheck source=../lib/cluster_env.sh
source "${RAILYARD_SOURCE_DIR:?}/tests/e2e/lib/cluster_env.sh" op-terminal
op_pid=""
fail() {
  echo "FAIL: $*" >&2
  kubectl get tj,pods -n "$ns" -o wide >&2 || true
  kubectl get tj -n "$ns" -o jsonpath='{range .items[*]}{.metadata.name}{": "}{.status}{"\n"}{end}' >&2 || true
  kubectl get events -n "$ns" >&2 || true
  tail -n 40 "$work/op.log" >&2 || true
  exit 1
}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
trap cleanup_operator_ns EXIT
jp() { kubectl get tj "$1" -n "$ns" -o jsonpath="$2" 2>/dev/null; }
phase_is() { [ "$(jp "$1" '{.status.phase}')" = "$2" ]; }
# The result: the whole status but the acknowledgements a finished job still gets (the spec version seen, also on each
# condition, and the live pod count, which cleanPodPolicy lowers).
result() {
  kubectl get tj "$1" -n "$ns" -o json | jq -S '.status | del(.observedGeneration, .replicas, .conditions[].observedGeneration)'
}
# Every condition's observedGeneration (one line per condition).
condition_generations() { kubectl get tj "$1" -n "$ns" -o json | jq -r '.status.conditions[].observedGeneration'; }
pod_uids() { kubectl get pods -n "$ns" -l "railyard.dev/job=$1" -o jsonpath='{.items[*].metadata.uid}'; }
# ignored_event JOB TEXT: an IgnoredAfterFinish event of JOB whose message contains TEXT.
ignored_event() {
  kubectl get events -n "$ns" --field-selector "involvedObject.name=$1,reason=IgnoredAfterFinish" \
    -o jsonpath='{range .items[*]}{.message}{"\n"}{end}' | grep -qF "$2"
}

# shellcheck source=../lib/job_manifest.sh
source "$src/tests/e2e/lib/job_manifest.sh"
job() { job_manifest "$1" command="$2" maxRestarts=3; } # job NAME COMMAND

install_crd "$src"
kubectl create namespace "$ns" >/dev/null
wait_for 60 "the default service account token" \
  bash -c "kubectl get sa default -n $ns -o jsonpath='{.secrets[0].name}' | grep -q ."
"$bin/railyard-operator" --namespace "$ns" --leader-elect=false --metrics-addr 127.0.0.1:0 \
  --health-addr 127.0.0.1:0 --rendezvous-bind 127.0.0.1:0 >"$work/op.log" 2>&1 &
op_pid=$!

job fin "exit 0" | kubectl apply -n "$ns" -f - >/dev/null
job boom "exit 3" | kubectl apply -n "$ns" -f - >/dev/null
wait_for 60 "job fin to succeed" phase_is fin Succeeded
wait_for 60 "job boom to fail" phase_is boom Failed

for j in fin boom; do
  want=$(jp "$j" '{.status.phase}')
  before=$(result "$j")
  uids=$(pod_uids "$j")
  g=$(jp "$j" '{.metadata.generation}')
  # Scale to a size the spec refuses (globalBatch 12 over 5 replicas): it used to turn the job Invalid.
  kubectl scale "tj/$j" -n "$ns" --replicas=5 >/dev/null
  wait_for 30 "$j: the ignored scale to 5 reported" ignored_event "$j" "generation $g -> $((g + 1))"
  # Scale back to a valid size: it used to open a new generation.
  kubectl scale "tj/$j" -n "$ns" --replicas=2 >/dev/null
  wait_for 30 "$j: the ignored scale to 2 reported" ignored_event "$j" "generation $((g + 1)) -> $((g + 2))"
  kubectl patch tj "$j" -n "$ns" --type=merge -p '{"spec":{"training":{"steps":20}}}' >/dev/null
  wait_for 30 "$j: the ignored edit reported" ignored_event "$j" "generation $((g + 2)) -> $((g + 3))"
  kubectl annotate tj "$j" -n "$ns" railyard.dev/restart-request=after-finish-1 >/dev/null
  wait_for 30 "$j: the ignored restart request reported" ignored_event "$j" "restart request 'after-finish-1' ignored"
  wait_for 30 "$j: the restart request acknowledged" \
    bash -c "[ \"\$(kubectl get tj $j -n $ns -o jsonpath='{.metadata.annotations.railyard\.dev/restart-handled}')\" = after-finish-1 ]"
  [ "$(jp "$j" '{.status.observedGeneration}')" = $((g + 3)) ] || fail "$j: observedGeneration $(jp "$j" '{.status.observedGeneration}')"
  # Conditions carry the generation too (the API server keeps the field: the CRD declares it), all of them the latest.
  [ "$(condition_generations "$j" | sort -u)" = $((g + 3)) ] ||
    fail "$j: conditions' observedGeneration $(condition_generations "$j" | tr '\n' ' '), want $((g + 3))"
  # Give a reopened job time to show itself before comparing.
  sleep 2
  [ "$(jp "$j" '{.status.phase}')" = "$want" ] || fail "$j: phase $(jp "$j" '{.status.phase}'), want $want"
  after=$(result "$j")
  [ "$after" = "$before" ] || fail "$j: status changed after finishing: $(diff <(echo "$before") <(echo "$after"))"
  [ -z "$(jp "$j" '{.status.conditions[?(@.type=="Invalid")].status}')" ] || fail "$j: got an Invalid condition"
  [ "$(pod_uids "$j")" = "$uids" ] || fail "$j: pods created or replaced after finishing"
  echo "job $j: $want kept through scale 5, scale 2, an edit and a restart request"
done
echo "terminal e2e: ok"
