#!/usr/bin/env bash
# E2E: the tiny example trained for real. `railyard data prepare` makes shards, the operator (with
# `railyard-worker agent` as its worker command) creates and binds the pod, the agent joins the rendezvous and runs
# `railyard-worker train --config`, progress (step, loss) reaches the job's status, and the job ends Succeeded.
set -euo pipefail
src=${RAILYARD_SOURCE_DIR:?}
state=${RAILYARD_E2E_STATE_DIR:?}
bin=${RAILYARD_BIN_DIR:?}
eval "$(bash "$src/deploy/local/cluster.sh" env --state-dir "$state")"
ns=op-tiny-e2e-$$
work=$(mktemp -d /tmp/op-tiny-e2e.XXXXXX)
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
cleanup() {
  [ -n "$op_pid" ] && kill "$op_pid" 2>/dev/null && wait "$op_pid" 2>/dev/null || true
  kubectl delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
jp() { kubectl get tj tiny -n "$ns" -o jsonpath="$1" 2>/dev/null; }

"$bin/railyard" data prepare --input /usr/share/common-licenses/* --output "$work/data" >/dev/null
install_crd "$src"
kubectl create namespace "$ns" >/dev/null
"$bin/railyard-operator" --namespace "$ns" --leader-elect=false --worker-command "$bin/railyard-worker" \
  --metrics-addr "127.0.0.1:$(free_port)" --health-addr "127.0.0.1:$(free_port)" --rendezvous-bind 127.0.0.1:0 \
  >"$work/op.log" 2>&1 &
op_pid=$!

# The example as shipped, with its data paths pointed at this test's shards.
sed -e "s|/tmp/railyard-data/|$work/data/|g" -e "s|/tmp/railyard-ckpt/tiny|$work/ckpt|" \
  "$src/deploy/examples/tiny.yaml" | kubectl apply -n "$ns" -f - >/dev/null

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
