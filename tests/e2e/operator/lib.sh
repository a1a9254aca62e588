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

# Installs the TrainingJob CRD from the checkout and waits until it is served.
install_crd() {
  kubectl apply -f "$1/deploy/crds/trainingjobs.railyard.dev.yaml" >/dev/null
  kubectl wait --for=condition=Established --timeout=60s crd/trainingjobs.railyard.dev >/dev/null 2>&1
}
