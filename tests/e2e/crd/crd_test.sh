#!/usr/bin/env bash
# E2E: the TrainingJob CRD on the real API server. The schema refuses malformed manifests with a message naming
# the field, fills defaults, serves printer columns, `kubectl explain` and the scale subresource.
set -euo pipefail
src=${RAILYARD_SOURCE_DIR:?}
state=${RAILYARD_E2E_STATE_DIR:?}
eval "$(bash "$src/deploy/local/cluster.sh" env --state-dir "$state")"
ns=crd-e2e-$$
fail() { echo "FAIL: $*" >&2; exit 1; }
cleanup() { kubectl delete namespace "$ns" --wait=false >/dev/null 2>&1 || true; }
trap cleanup EXIT

kubectl apply -f "$src/deploy/crds/trainingjobs.railyard.dev.yaml" >/dev/null
kubectl wait --for=condition=Established --timeout=60s crd/trainingjobs.railyard.dev >/dev/null 2>&1
kubectl create namespace "$ns" >/dev/null

# Every example is accepted as written.
for f in "$src"/deploy/examples/*.yaml; do
  kubectl apply -n "$ns" --dry-run=server -f "$f" >/dev/null || fail "example $f refused"
done

# What `railyard convert` makes of Kubeflow's PyTorchJobs and TrainJobs is accepted too (namespace taken from here).
bin=${RAILYARD_BIN_DIR:?}
for f in "$src"/tests/unit/cli/manifests/pytorchjob-*.* "$src"/tests/unit/cli/manifests/trainjob-torch.yaml; do
  out=$("$bin/railyard" convert "$f" 2>/dev/null) || fail "railyard convert $f failed"
  sed '/^  namespace: /d' <<<"$out" | kubectl apply -n "$ns" --dry-run=server -f - >/dev/null ||
    fail "the conversion of $(basename "$f") was refused by the CRD"
done

# Every malformed manifest is refused, and the message names the field. The API server's own validation is what
# protects the cluster from any client, so it is checked with kubectl's client-side validation off; unknown fields
# are pruned by the server (structural schema), so that case is checked with client-side validation on.
refused=0
for f in "$(dirname "$0")"/bad/*.yaml; do
  if want=$(sed -n 's/^# expect: //p' "$f") && [ -n "$want" ]; then
    validate=--validate=false
  else
    want=$(sed -n 's/^# expect-client: //p' "$f")
    validate=--validate=true
  fi
  [ -n "$want" ] || fail "$(basename "$f") has no '# expect:' line"
  if out=$(kubectl apply -n "$ns" "$validate" -f "$f" 2>&1); then
    fail "$(basename "$f") was accepted: $out"
  fi
  grep -qF "$want" <<<"$out" || fail "$(basename "$f"): refusal does not name '$want': $out"
  refused=$((refused + 1))
done
[ "$refused" -ge 15 ] || fail "only $refused malformed manifests checked"
echo "refused $refused malformed manifests, each naming its field"

# Defaults are filled by the API server.
kubectl apply -n "$ns" -f "$src/deploy/examples/tiny.yaml" >/dev/null
got=$(kubectl get tj tiny -n "$ns" -o jsonpath='{.spec.procsPerReplica} {.spec.training.gradClip} {.spec.runPolicy.cleanPodPolicy} {.spec.failurePolicy.hangTimeoutSeconds}')
# runPolicy is absent in tiny.yaml, so its defaults do not apply; the failurePolicy defaults do.
[ "$got" = "1 1  300" ] || fail "defaults not applied as expected: '$got'"

# Printer columns, short name and category.
# (Output is captured first: `cmd | head` can kill cmd with SIGPIPE, which pipefail turns into a silent failure.)
listing=$(kubectl get tj -n "$ns")
header=$(head -1 <<<"$listing")
for col in NAME PHASE PROGRESS LOSS RESTARTS AGE; do
  grep -qw "$col" <<<"$header" || fail "column $col missing from: $header"
done
wide=$(kubectl get tj -n "$ns" -o wide)
for col in WORLD GENERATION GOODPUT; do
  grep -qw "$col" <<<"$(head -1 <<<"$wide")" || fail "column $col missing from -o wide: $(head -1 <<<"$wide")"
done
names=$(kubectl get railyard -n "$ns" -o name)
grep -q trainingjob.railyard.dev/tiny <<<"$names" || fail "category railyard: $names"

# kubectl explain is useful.
explain=$(kubectl explain tj.spec.parallelism)
grep -q "Tensor-parallel degree" <<<"$explain" || fail "explain lacks descriptions: $explain"

# The scale subresource resizes spec.replicas.
kubectl scale tj/tiny -n "$ns" --replicas=3 >/dev/null
[ "$(kubectl get tj tiny -n "$ns" -o jsonpath='{.spec.replicas}')" = 3 ] || fail "scale did not change spec.replicas"

# Status is a subresource: a spec update cannot write it.
kubectl patch tj tiny -n "$ns" --type=merge -p '{"status":{"phase":"Running"}}' >/dev/null
[ -z "$(kubectl get tj tiny -n "$ns" -o jsonpath='{.status.phase}')" ] || fail "status written through the main resource"
echo "CRD e2e: ok"
