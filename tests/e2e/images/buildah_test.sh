#!/usr/bin/env bash
# E2E (on demand, label bench: about 15 minutes cold, most of it two CMake builds inside buildah): the Dockerfiles of
# deploy/docker/ build as written, with buildah (deploy/images/buildah.sh: FROM images made here from debootstrap,
# nothing pulled), and their images run on real nodes (kubelet + containerd):
#   1. the operator image: railyard-operator --help and railyard-monitor --help run as pods (exit 0, usage in the log),
#      as uid 65532 (the Dockerfile's USER);
#   2. the worker image: the tiny example, its spec.image set to the buildah-built worker, trains to Succeeded
#      (200/200 steps) under the operator on the host.
#   ctest -L bench -R e2e_buildah_images   (docs/images.md "With buildah")
set -euo pipefail
# shellcheck source=../lib/real_env.sh
source "${RAILYARD_SOURCE_DIR:?}/tests/e2e/lib/real_env.sh" buildah-e2e
op_pid=""
fail() {
  echo "FAIL: $*" >&2
  kubectl get tj,pods -n "$ns" -o wide >&2 || true
  kubectl get events -n "$ns" --sort-by=.lastTimestamp 2>/dev/null | tail -15 >&2 || true
  [ -f "$work/op.log" ] && tail -20 "$work/op.log" >&2
  exit 1
}
# shellcheck source=../operator/lib.sh
source "$src/tests/e2e/operator/lib.sh"
trap cleanup_operator_cluster EXIT

# --- 0. build ------------------------------------------------------------------------------------------------------
t0=$SECONDS
bash "$src/deploy/images/buildah.sh" --out "$work/images" --tag e2e 2>"$work/buildah.log" ||
  { cat "$work/buildah.log" >&2; fail "deploy/images/buildah.sh"; }
cat "$work/buildah.log"
log "both Dockerfiles built with buildah in $((SECONDS - t0)) s"

# --- 1. a real node, the images loaded -------------------------------------------------------------------------------
bash "$cluster" down --state-dir "$state" >/dev/null 2>&1 || true
bash "$cluster" up --state-dir "$state" --real-nodes 1 >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; fail "cluster up"; }
eval "$(bash "$cluster" env --state-dir "$state")"
socks=("$state"/real/*/run/containerd.sock)
[ -S "${socks[0]}" ] || fail "no real node's containerd socket under $state/real"
for sock in "${socks[@]}"; do
  for img in operator worker; do
    ctr -a "$sock" -n k8s.io images import "$work/images/$img-buildah.tar" >/dev/null || fail "import $img into $sock"
  done
done
kubectl create namespace "$ns" >/dev/null
install_crd "$src"

# --- 2. the operator image -------------------------------------------------------------------------------------------
run_help() { # POD COMMAND: the operator image runs COMMAND --help to completion; its log shows the usage
  cat <<YAML | kubectl apply -n "$ns" -f - >/dev/null
apiVersion: v1
kind: Pod
metadata: {name: $1}
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  containers:
    - name: c
      image: localhost/railyard/operator:e2e
      imagePullPolicy: Never
      command: [$2, --help]
YAML
  wait_for 90 "$1 Succeeded" sh -c "[ \"\$(kubectl get pod $1 -n $ns -o jsonpath='{.status.phase}')\" = Succeeded ]"
  grep -q "^usage: $2" <<<"$(kubectl logs "$1" -n "$ns")" || fail "$1: no usage line in its log: $(kubectl logs "$1" -n "$ns" | head -3)"
}
run_help op-help railyard-operator
run_help mon-help railyard-monitor
cat <<YAML | kubectl apply -n "$ns" -f - >/dev/null
apiVersion: v1
kind: Pod
metadata: {name: op-id}
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  containers:
    - {name: c, image: localhost/railyard/operator:e2e, imagePullPolicy: Never, command: [id, -u]}
YAML
wait_for 90 "op-id Succeeded" sh -c "[ \"\$(kubectl get pod op-id -n $ns -o jsonpath='{.status.phase}')\" = Succeeded ]"
[ "$(kubectl logs op-id -n "$ns")" = 65532 ] || fail "the operator image does not run as uid 65532: $(kubectl logs op-id -n "$ns")"
log "operator image: railyard-operator and railyard-monitor run (--help), as uid 65532"

# --- 3. the worker image trains the tiny example ---------------------------------------------------------------------
shared=$(bash "$cluster" share "$ns" --state-dir "$state")
"$bin/railyard" data prepare --input /usr/share/common-licenses/* --output "$shared/data" >/dev/null
start_host_operator
t0=$SECONDS
sed 's|^  replicas: 1$|  replicas: 1\n  image: localhost/railyard/worker:e2e|' "$src/deploy/examples/tiny.yaml" |
  kubectl apply -n "$ns" -f - >/dev/null
[ "$(kubectl get tj tiny -n "$ns" -o jsonpath='{.spec.image}')" = localhost/railyard/worker:e2e ] ||
  fail "the tiny job does not name the buildah image"
phase=""
until [ "$phase" = Succeeded ]; do
  phase=$(kubectl get tj tiny -n "$ns" -o jsonpath='{.status.phase}')
  case "$phase" in Failed | Invalid) fail "tiny ended $phase" ;; esac
  [ $((SECONDS - t0)) -lt 300 ] || fail "tiny not Succeeded after 300 s (phase '$phase')"
  sleep 1
done
[ "$(kubectl get pod tiny-worker-0 -n "$ns" -o jsonpath='{.status.containerStatuses[0].image}')" = \
  localhost/railyard/worker:e2e ] || fail "tiny's worker did not run from localhost/railyard/worker:e2e"
[ "$(kubectl get tj tiny -n "$ns" -o jsonpath='{.status.progress}')" = 200/200 ] ||
  fail "tiny progress $(kubectl get tj tiny -n "$ns" -o jsonpath='{.status.progress}'), want 200/200"
log "worker image: the tiny example trained to Succeeded (200/200) in $((SECONDS - t0)) s"
echo PASS
