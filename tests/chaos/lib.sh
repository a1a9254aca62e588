# Shared helpers of the tests/chaos e2e scripts (sourced). The script sets src, bin, ns, work and pids (processes it
# started, stopped by pid on exit) and defines its own fail() (what to dump differs).
# shellcheck shell=bash disable=SC2154

# shellcheck source=../e2e/operator/lib.sh
source "$src/tests/e2e/operator/lib.sh"
# shellcheck source=../e2e/lib/job_manifest.sh
source "$src/tests/e2e/lib/job_manifest.sh"

jp() { kubectl get tj "$1" -n "$ns" -o jsonpath="$2" 2>/dev/null; }
phase_is() { [ "$(jp "$1" '{.status.phase}')" = "$2" ]; }

# Every job's row and status, for a failure message.
dump_jobs() {
  kubectl get tj,pods -n "$ns" -o wide >&2 || true
  kubectl get tj -n "$ns" -o jsonpath='{range .items[*]}{.metadata.name}{": "}{.status}{"\n"}{end}' >&2 || true
}

# Stops what the script started, drops its namespace; RAILYARD_E2E_KEEP=DIR keeps the work dir (logs) for a look.
chaos_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  kubectl delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
  if [ -n "${RAILYARD_E2E_KEEP:-}" ]; then mkdir -p "$RAILYARD_E2E_KEEP" && cp -r "$work"/. "$RAILYARD_E2E_KEEP"/; fi
  rm -rf "$work"
}

# The CRD, the namespace, and its default service account's token (pods need it).
setup_namespace() {
  install_crd "$src"
  kubectl create namespace "$ns" >/dev/null
  wait_for 60 "the default service account token" \
    bash -c "kubectl get sa default -n $ns -o jsonpath='{.secrets[0].name}' | grep -q ."
}

# The operator straight at the API server (no proxy, no leader election, every port its own), logging to
# $work/op.log; op_pid is its pid, also in pids. Returns once it reconciles.
start_operator_direct() {
  "$bin/railyard-operator" --namespace "$ns" --leader-elect=false \
    --metrics-addr 127.0.0.1:0 --health-addr 127.0.0.1:0 --rendezvous-bind 127.0.0.1:0 >"$work/op.log" 2>&1 &
  op_pid=$!
  pids+=("$op_pid")
  wait_for 30 "the operator to start" grep -q "leading: reconciling" "$work/op.log"
}

# shell_job NAME REPLICAS MAXRESTARTS COMMAND: a TrainingJob whose pods run `sh -c COMMAND` (no agent).
shell_job() { job_manifest "$1" replicas="$2" maxRestarts="$3" command="$4"; }
