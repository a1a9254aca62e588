# Shared helpers of the operator e2e scripts (sourced). Each script defines its own fail() (what to dump differs).

# A free TCP port on 127.0.0.1.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# wait_for SECONDS DESCRIPTION COMMAND...: polls every 0.3 s until COMMAND succeeds, else fail().
wait_for() {
  local limit=$1 what=$2 t0=$SECONDS
  shift 2
  until "$@" >/dev/null 2>&1; do
    [ $((SECONDS - t0)) -lt "$limit" ] || fail "timed out after ${limit}s waiting for $what"
    sleep 0.3
  done
}

# The EXIT trap's work in a script that runs one operator (op_pid, empty until it starts) in namespace ns: stops it,
# drops the namespace (without waiting) and the work dir.
# shellcheck disable=SC2154  # op_pid, ns and work are the script's
cleanup_operator_ns() {
  if [ -n "$op_pid" ]; then kill "$op_pid" 2>/dev/null || true; wait "$op_pid" 2>/dev/null || true; fi
  kubectl delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
  rm -rf "$work"
}

# The same for a script that brought up its own cluster (deploy/local/cluster.sh at $cluster, its state in $state,
# real nodes most often): stops the operator, takes the cluster down and removes the work dir.
# shellcheck disable=SC2154  # op_pid, cluster, state and work are the script's
cleanup_operator_cluster() {
  if [ -n "$op_pid" ]; then kill "$op_pid" 2>/dev/null || true; wait "$op_pid" 2>/dev/null || true; fi
  bash "$cluster" down --state-dir "$state" >/dev/null 2>&1 || true
  rm -rf "$work"
}

# The operator on the host for a cluster of real nodes (deploy/local/cluster.sh up --real-nodes): its pods run the
# worker image localhost/railyard/worker:0.1.0 and dial its rendezvous at the host's address on the pod network
# ($RAILYARD_POD_HOST_ADDR). Logs to $work/op.log; op_pid is its pid.
# shellcheck disable=SC2154  # bin, ns and work are the script's
start_host_operator() {
  "$bin/railyard-operator" --namespace "$ns" --leader-elect=false --worker-image localhost/railyard/worker:0.1.0 \
    --metrics-addr "127.0.0.1:$(free_port)" --health-addr "127.0.0.1:$(free_port)" \
    --rendezvous-bind "$RAILYARD_POD_HOST_ADDR:0" >"$work/op.log" 2>&1 &
  op_pid=$!
}

# Installs the TrainingJob CRD from the checkout and waits until it is served. Polls the condition rather than
# trusting one `kubectl wait`: right after a cluster came up, one such wait exited at once with an error that its
# silenced output hid (a CI run of 2026-12-07: e2e_scheduler failed in 0.95 s with no line printed).
install_crd() {
  kubectl apply -f "$1/deploy/crds/trainingjobs.railyard.dev.yaml" >/dev/null
  local t0=$SECONDS got=""
  while [ $((SECONDS - t0)) -lt 60 ]; do
    got=$(kubectl get crd trainingjobs.railyard.dev \
      -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>&1) || true
    [ "$got" = True ] && return 0
    sleep 0.3
  done
  echo "FAIL: the TrainingJob CRD is not Established 60 s after kubectl apply (last: $got)" >&2
  return 1
}

# restricted_pods NS SELECTOR-OR-POD: the pods pass the "restricted" Pod Security Standard's rules
# (tests/e2e/lib/pod_security.py; the 1.20 API server has no PodSecurity admission), and the first one's main process
# (PID 1 of its first container) runs as the kubelet and runc set it up: no new privileges, a seccomp filter
# (RuntimeDefault), no effective capabilities, not root. Prints the violations and returns 1 otherwise.
restricted_pods() {
  local ns=$1 what=$2 json st pod
  case "$what" in *=*) json=$(kubectl get pods -n "$ns" -l "$what" -o json) ;; *) json=$(kubectl get pod "$what" -n "$ns" -o json) ;; esac
  python3 "$src/tests/e2e/lib/pod_security.py" - <<<"$json" >&2 || return 1
  pod=$(jq -r 'if .items then .items[0].metadata.name else .metadata.name end' <<<"$json")
  st=$(kubectl exec "$pod" -n "$ns" -- cat /proc/1/status) || { echo "kubectl exec $pod: no /proc/1/status" >&2; return 1; }
  local bad=""
  grep -qE '^NoNewPrivs:[[:space:]]+1$' <<<"$st" || bad+=" NoNewPrivs!=1"
  grep -qE '^Seccomp:[[:space:]]+2$' <<<"$st" || bad+=" Seccomp!=2(filter)"
  grep -qE '^CapEff:[[:space:]]+0+$' <<<"$st" || bad+=" CapEff!=0"
  grep -qE '^Uid:[[:space:]]+[1-9][0-9]*[[:space:]]' <<<"$st" || bad+=" Uid=0"
  [ -z "$bad" ] || { echo "$pod PID 1:$bad"$'\n'"$(grep -E '^(Uid|NoNewPrivs|Seccomp|Cap)' <<<"$st")" >&2; return 1; }
  echo "restricted: $pod PID 1 runs without privileges ($(grep -E '^Uid' <<<"$st" | awk '{print "uid " $2}'), seccomp filter, no capabilities)"
}

# example_as_on_host NAME [CLAIM]: deploy/examples/NAME.yaml without its own volume and initializer, for a test that
# points the job at shards it prepared itself; with CLAIM, mounted where the job's own volume would be
# (tests/e2e/lib/example_on_claim.py).
example_as_on_host() {
  python3 "$src/tests/e2e/lib/example_on_claim.py" "$src/deploy/examples/$1.yaml" "${@:2}"
}
