# shellcheck shell=bash
# up/down/status/env/restart-apiserver/restart-etcd for cluster.sh. Sourced after lib/build.sh; uses STATE_DIR, NODES,
# TOPOLOGY, NODE_AGENT, NO_NODE_AGENT, REPO_ROOT, CACHE_BIN, die, info.

MARKER_NAME=".railyard-cluster"
SIM_LABEL="railyard.dev/simulated=true"
NODE_WAIT_SECONDS=60

# --- small helpers -----------------------------------------------------------------------------------------

# Every process we start has the state dir in its arguments; checking that keeps a recycled pid safe.
pid_is_ours() {
  local pid="$1"
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  local state
  state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) || return 1
  [ "$state" != "Z" ] || return 1
  tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$STATE_DIR"
}

component_pid() { cat "$STATE_DIR/pids/$1.pid" 2>/dev/null || true; }

# A process in the middle of an exec (our shell -> setsid -> the component) can show an empty command line for a
# moment, which pid_is_ours reads as "not ours": on a loaded machine a start-up check landed there and stopped a
# healthy etcd. A starting component is dead only if it is still not alive half a second later.
component_gone() { ! component_alive "$1" && ! { sleep 0.5 && component_alive "$1"; }; }

component_alive() { pid_is_ours "$(component_pid "$1")"; }

# Starts a detached process (own session, so a terminal or ctest's process group cannot take it down) whose
# only outputs are its log file; records its pid.
start_component() {
  local name="$1"
  shift
  mkdir -p "$STATE_DIR/logs" "$STATE_DIR/pids"
  echo "--- $(date -u +%FT%TZ) starting: $*" >>"$STATE_DIR/logs/$name.log"
  # fd 8/9 are our flock locks: a child holding them would block every later cluster.sh.
  setsid "$@" </dev/null >>"$STATE_DIR/logs/$name.log" 2>&1 8>&- 9>&- &
  local pid=$!
  echo "$pid" >"$STATE_DIR/pids/$name.pid"
}

stop_component() {
  local name="$1" timeout="${2:-10}"
  local pidfile="$STATE_DIR/pids/$name.pid"
  [ -f "$pidfile" ] || return 0
  local pid
  pid=$(cat "$pidfile")
  if pid_is_ours "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + timeout))
    while pid_is_ours "$pid" && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    if pid_is_ours "$pid"; then
      info "$name (pid $pid) did not stop within ${timeout}s, sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      deadline=$((SECONDS + 10))
      while pid_is_ours "$pid" && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
    fi
  fi
  rm -f "$pidfile"
}

log_tail() {
  local name="$1"
  echo "--- last lines of $STATE_DIR/logs/$name.log:" >&2
  tail -n 25 "$STATE_DIR/logs/$name.log" >&2 2>/dev/null || true
}

port_in_use() { [ -n "$(ss -Htln "sport = :$1" 2>/dev/null)" ]; }

# Random ports below Linux's ephemeral range (32768+), so outgoing connections never hold them.
pick_ports() {
  local picked=() p tries
  while [ ${#picked[@]} -lt 4 ]; do
    tries=0
    while :; do
      tries=$((tries + 1))
      [ $tries -le 200 ] || die "up: no free port found on 127.0.0.1 in 20000-32767"
      p=$((20000 + SRANDOM % 12768))
      port_in_use "$p" && continue
      [[ " ${picked[*]} " == *" $p "* ]] && continue
      break
    done
    picked+=("$p")
  done
  ETCD_CLIENT_PORT=${picked[0]}
  ETCD_PEER_PORT=${picked[1]}
  APISERVER_PORT=${picked[2]}
  KCM_PORT=${picked[3]}
  # Only allocation metadata, but distinct per cluster so nothing ever looks shared.
  SERVICE_CIDR="10.$(((APISERVER_PORT >> 8) & 255)).$((APISERVER_PORT & 255)).0/24"
}

load_state() {
  [ -f "$STATE_DIR/state.env" ] || return 1
  # shellcheck disable=SC1091
  source "$STATE_DIR/state.env"
}

save_state() {
  {
    printf 'ETCD_CLIENT_PORT=%q\n' "$ETCD_CLIENT_PORT"
    printf 'ETCD_PEER_PORT=%q\n' "$ETCD_PEER_PORT"
    printf 'APISERVER_PORT=%q\n' "$APISERVER_PORT"
    printf 'KCM_PORT=%q\n' "$KCM_PORT"
    printf 'SERVICE_CIDR=%q\n' "$SERVICE_CIDR"
    printf 'ADMIN_TOKEN=%q\n' "$ADMIN_TOKEN"
    printf 'KCM_TOKEN=%q\n' "$KCM_TOKEN"
    printf 'NODE_AGENT_TOKEN=%q\n' "$NODE_AGENT_TOKEN"
    printf 'NODE_MONITOR_GRACE=%q\n' "${NODE_MONITOR_GRACE:-4}"
    printf 'CONTROLLER_MANAGER_QPS=%q\n' "${CONTROLLER_MANAGER_QPS:-}"
    printf 'REAL_NODES=%q\n' "${REAL_NODES:-0}"
    printf 'API_ADVERTISE_ADDR=%q\n' "${API_ADVERTISE_ADDR:-127.0.0.1}"
  } >"$STATE_DIR/state.env"
  chmod 600 "$STATE_DIR/state.env"
}

# --- health ------------------------------------------------------------------------------------------------

etcd_healthy() {
  curl -sf --max-time 2 "http://127.0.0.1:$ETCD_CLIENT_PORT/health" 2>/dev/null | grep -q '"health":"true"'
}

apiserver_ready() {
  [ "$(curl -s --max-time 3 --cacert "$STATE_DIR/pki/ca.crt" -H "Authorization: Bearer $ADMIN_TOKEN" \
    "https://127.0.0.1:$APISERVER_PORT/readyz" 2>/dev/null)" = "ok" ]
}

kcm_healthy() {
  # Its serving certificate is self-signed at start-up, hence -k; /healthz needs no credentials.
  [ "$(curl -sk --max-time 3 "https://127.0.0.1:$KCM_PORT/healthz" 2>/dev/null)" = "ok" ]
}

# wait_for NAME SECONDS CHECK: polls CHECK, failing early (with the log) if the process died.
wait_for() {
  local name="$1" timeout="$2" check="$3"
  local deadline=$((SECONDS + timeout))
  while ! "$check"; do
    if component_gone "$name"; then
      log_tail "$name"
      die "up: $name exited during start-up (log: $STATE_DIR/logs/$name.log)"
    fi
    if [ $SECONDS -ge $deadline ]; then
      log_tail "$name"
      die "up: $name not healthy after ${timeout}s (log: $STATE_DIR/logs/$name.log)"
    fi
    sleep 0.25
  done
}

# --- PKI, tokens, kubeconfigs ------------------------------------------------------------------------------

gen_pki() {
  local pki="$STATE_DIR/pki"
  mkdir -p "$pki"
  chmod 700 "$pki"
  local ip_prefix="${SERVICE_CIDR%.0/24}"
  {
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 -keyout "$pki/ca.key" -out "$pki/ca.crt" \
      -subj "/CN=railyard-local-ca" -addext "basicConstraints=critical,CA:TRUE" \
      -addext "keyUsage=critical,keyCertSign,cRLSign"
    openssl req -newkey rsa:2048 -nodes -sha256 -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" \
      -subj "/CN=kube-apiserver"
    cat >"$pki/apiserver.ext" <<EOF
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:$ip_prefix.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local
EOF
    openssl x509 -req -sha256 -days 825 -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
      -CAcreateserial -CAserial "$pki/ca.srl" -extfile "$pki/apiserver.ext" -out "$pki/apiserver.crt"
    openssl genrsa -out "$pki/sa.key" 2048
    openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub"
  } >>"$STATE_DIR/logs/pki.log" 2>&1 || die "up: openssl failed (see $STATE_DIR/logs/pki.log)"
  chmod 600 "$pki"/*.key
  gen_kubelet_client_pki
}

gen_tokens() {
  ADMIN_TOKEN=$(openssl rand -hex 32)
  KCM_TOKEN=$(openssl rand -hex 32)
  NODE_AGENT_TOKEN=$(openssl rand -hex 32)
  # Format: token,user,uid,"groups". The node agent gets no groups: RBAC alone decides what it may do.
  {
    echo "$ADMIN_TOKEN,railyard-admin,railyard-admin,\"system:masters\""
    echo "$KCM_TOKEN,system:kube-controller-manager,system:kube-controller-manager"
    echo "$NODE_AGENT_TOKEN,system:railyard-node-agent,system:railyard-node-agent"
  } >"$STATE_DIR/pki/tokens.csv"
  chmod 600 "$STATE_DIR/pki/tokens.csv"
}

write_kubeconfig() {
  local file="$1" user="$2" token="$3"
  local ca_data
  ca_data=$(base64 -w0 "$STATE_DIR/pki/ca.crt")
  cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: railyard-local
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $ca_data
users:
- name: $user
  user:
    token: $token
contexts:
- name: $user@railyard-local
  context:
    cluster: railyard-local
    user: $user
current-context: $user@railyard-local
EOF
  chmod 600 "$file"
}

write_cluster_env() {
  {
    echo "# Written by deploy/local/cluster.sh up; source it to talk to this cluster."
    printf 'export KUBECONFIG=%q\n' "$STATE_DIR/kubeconfig"
    printf 'export APISERVER_URL=%q\n' "https://127.0.0.1:$APISERVER_PORT"
    printf 'export APISERVER_PORT=%q\n' "$APISERVER_PORT"
    printf 'export ETCD_URL=%q\n' "http://127.0.0.1:$ETCD_CLIENT_PORT"
    printf 'export ETCD_CLIENT_PORT=%q\n' "$ETCD_CLIENT_PORT"
    printf 'export CACHE_BIN=%q\n' "$CACHE_BIN"
    printf 'export STATE_DIR=%q\n' "$STATE_DIR"
  } >"$STATE_DIR/cluster.env"
}

# --- components --------------------------------------------------------------------------------------------

start_etcd() {
  mkdir -p "$STATE_DIR/etcd"
  chmod 700 "$STATE_DIR/etcd"
  start_component etcd etcd --name railyard-local --data-dir "$STATE_DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "railyard-local=http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster-state new
  wait_for etcd 30 etcd_healthy
}

start_apiserver() {
  local pki="$STATE_DIR/pki"
  # OwnerReferencesPermissionEnforcement (on top of the default plugins), as on OpenShift and hardened clusters: an
  # ownerReference with blockOwnerDeletion needs update on the owner's finalizers, so a missing RBAC rule for it shows
  # here (e2e_install_chart runs the operator with the chart's RBAC) instead of on a user's cluster.
  # Short toleration seconds: pods on a lost simulated node are evicted in seconds, not 5 minutes.
  start_component kube-apiserver "$CACHE_BIN/kube-apiserver" \
    --enable-admission-plugins OwnerReferencesPermissionEnforcement \
    --etcd-servers "http://127.0.0.1:$ETCD_CLIENT_PORT" \
    --bind-address 127.0.0.1 --advertise-address "${API_ADVERTISE_ADDR:-127.0.0.1}" --secure-port "$APISERVER_PORT" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" --token-auth-file "$pki/tokens.csv" \
    --authorization-mode Node,RBAC \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --cert-dir "$STATE_DIR/pki/apiserver-generated" \
    --endpoint-reconciler-type "$([ "${API_ADVERTISE_ADDR:-127.0.0.1}" = 127.0.0.1 ] && echo none || echo lease)" --profiling="${RAILYARD_APISERVER_PROFILING:-false}" \
    --default-not-ready-toleration-seconds 2 --default-unreachable-toleration-seconds 2 \
    --kubelet-preferred-address-types InternalIP --kubelet-certificate-authority "$pki/ca.crt" \
    --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$pki/apiserver-kubelet-client.key"
  wait_for kube-apiserver 120 apiserver_ready
}

start_controller_manager() {
  local pki="$STATE_DIR/pki"
  local kcm_controllers=garbagecollector,namespace,nodelifecycle,serviceaccount,serviceaccount-token,podgc,persistentvolume-binder,pvc-protection,pv-protection,clusterrole-aggregation
  # Real nodes run the chart's Deployments and reach Services: their controllers and the Services' endpoints, with the
  # mirroring of hand-written Endpoints into EndpointSlices (what kube-proxy reads) that every real cluster runs: the
  # rendezvous Service has no selector, its leader writes its Endpoints.
  [ "${REAL_NODES:-0}" -gt 0 ] && kcm_controllers+=,deployment,replicaset,endpoint,endpointslice,endpointslicemirroring,disruption
  local limits=()
  [ -z "${CONTROLLER_MANAGER_QPS:-}" ] ||
    limits=(--kube-api-qps "$CONTROLLER_MANAGER_QPS" --kube-api-burst "$((2 * CONTROLLER_MANAGER_QPS))")
  start_component kube-controller-manager "$CACHE_BIN/kube-controller-manager" \
    --kubeconfig "$STATE_DIR/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --port 0 \
    --cert-dir "$STATE_DIR/pki/controller-manager-generated" \
    --leader-elect=false \
    --controllers "$kcm_controllers" \
    --use-service-account-credentials=true \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --allocate-node-cidrs=false --pvclaimbinder-sync-period 1s \
    --node-monitor-period 1s --node-monitor-grace-period "${NODE_MONITOR_GRACE:-4}s" \
    --node-startup-grace-period "${NODE_MONITOR_GRACE:-4}s" \
    --unhealthy-zone-threshold 1.0 --node-eviction-rate 100 ${limits[@]+"${limits[@]}"}
  wait_for kube-controller-manager 60 kcm_healthy
}

kubectl_admin() { "$CACHE_BIN/kubectl" --kubeconfig "$STATE_DIR/kubeconfig" "$@"; }

apply_node_agent_rbac() {
  local rbac="$REPO_ROOT/deploy/local/node-agent-rbac.yaml"
  if [ ! -f "$rbac" ]; then
    info "up: $rbac not present, node-agent RBAC not applied"
    return 0
  fi
  kubectl_admin apply -f "$rbac" >>"$STATE_DIR/logs/kubectl.log" 2>&1 ||
    die "up: kubectl apply -f $rbac failed (see $STATE_DIR/logs/kubectl.log)"
}

ready_sim_nodes() {
  kubectl_admin get nodes -l "$SIM_LABEL" \
    -o jsonpath='{range .items[*]}{range .status.conditions[?(@.type=="Ready")]}{.status}{"\n"}{end}{end}' \
    2>/dev/null | grep -c '^True$' || true
}

start_node_agent() {
  local agent="$1" expected="$2"
  local grace="${NODE_MONITOR_GRACE:-4}"
  # Renew four times per grace period, like a kubelet (10 s for the default 40 s), at least every second.
  local args=(run --kubeconfig "$STATE_DIR/node-agent.kubeconfig" --state-dir "$STATE_DIR/node-agent"
    --lease-interval "$((grace >= 8 ? grace / 4 : 1))")
  if [ -n "$TOPOLOGY" ]; then args+=(--topology "$TOPOLOGY"); else args+=(--nodes "$expected"); fi
  mkdir -p "$STATE_DIR/node-agent"
  start_component node-agent "$agent" "${args[@]}"
  info "up: node agent started (pid $(component_pid node-agent)), waiting for $expected Ready node(s)"
  local deadline=$((SECONDS + NODE_WAIT_SECONDS)) ready=0
  while :; do
    ready=$(ready_sim_nodes)
    [ "$ready" -ge "$expected" ] && break
    if component_gone node-agent; then
      log_tail node-agent
      die "up: railyard-node-agent exited (log: $STATE_DIR/logs/node-agent.log)"
    fi
    if [ $SECONDS -ge $deadline ]; then
      log_tail node-agent
      die "up: only $ready of $expected simulated nodes Ready after ${NODE_WAIT_SECONDS}s" \
        "(log: $STATE_DIR/logs/node-agent.log)"
    fi
    sleep 0.5
  done
}

# Stop order matters: the controller manager holds watches that delay an API-server SIGTERM by a minute.
stop_all() {
  stop_real_nodes
  stop_component node-agent 15
  stop_component kube-controller-manager 10
  stop_component kube-apiserver 10
  stop_component etcd 10
}

control_plane_healthy() {
  load_state || return 1
  component_alive etcd && component_alive kube-apiserver && component_alive kube-controller-manager &&
    etcd_healthy && apiserver_ready && kcm_healthy
}

dir_is_ours_or_empty() {
  [ ! -e "$STATE_DIR" ] && return 0
  [ -d "$STATE_DIR" ] || return 1
  [ -f "$STATE_DIR/$MARKER_NAME" ] && return 0
  [ -z "$(ls -A "$STATE_DIR")" ]
}

# One up/down/restart at a time per state dir; the lock lives outside the dir because down removes it.
lock_state_dir() {
  local locks="$CACHE_ROOT/locks"
  mkdir -p "$locks"
  exec 8>"$locks/$(printf '%s' "$STATE_DIR" | sha256sum | cut -c1-16).lock"
  if ! flock -n 8; then
    info "waiting for another cluster.sh on $STATE_DIR"
    flock -w 600 8 || die "another cluster.sh has held the lock on $STATE_DIR for 10 minutes"
  fi
}

# --- commands ----------------------------------------------------------------------------------------------

resolve_node_agent() {
  AGENT=""
  if [ "${REAL_NODES:-0}" -gt 0 ] && [ -z "$NODES" ] && [ -z "$TOPOLOGY" ] && [ -z "$NODE_AGENT" ]; then
    NO_NODE_AGENT=1
  fi
  if [ "$NO_NODE_AGENT" = 1 ]; then
    [ -z "$NODE_AGENT" ] || die "up: --node-agent and --no-node-agent exclude each other"
    return 0
  fi
  if [ -n "$NODE_AGENT" ]; then
    [ -f "$NODE_AGENT" ] && [ -x "$NODE_AGENT" ] ||
      die "up: --node-agent $NODE_AGENT is not an executable file; build it" \
        "(cmake --build build --target railyard-node-agent), point --node-agent at it, or use --no-node-agent"
    AGENT="$(realpath -- "$NODE_AGENT")"
  elif [ -x "$REPO_ROOT/build/bin/railyard-node-agent" ]; then
    AGENT="$REPO_ROOT/build/bin/railyard-node-agent"
  fi
}

# The agent itself expands the topology, so the count (and any error in the file) is exactly what it will use.
compute_expected_nodes() {
  EXPECTED="${NODES:-4}"
  [ -n "$TOPOLOGY" ] || return 0
  if [ -z "$AGENT" ]; then
    info "up: --topology given but no node agent to use it; control plane only"
    return 0
  fi
  local names err
  err=$(mktemp)
  if ! names=$("$AGENT" nodes --topology "$TOPOLOGY" 2>"$err"); then
    local msg
    msg=$(head -1 "$err")
    rm -f "$err"
    die "up: --topology $TOPOLOGY rejected by the node agent: ${msg:-no reason given}"
  fi
  rm -f "$err"
  EXPECTED=$(grep -c . <<<"$names" || true)
  [ "$EXPECTED" -ge 1 ] || die "up: --topology $TOPOLOGY gives no nodes"
}

cmd_up() {
  if [ -n "$NODES" ] && [ -n "$TOPOLOGY" ]; then die "up: give --nodes or --topology, not both"; fi
  if [ -n "$NODES" ] && ! [[ "$NODES" =~ ^[1-9][0-9]{0,3}$ ]]; then
    die "up: --nodes '$NODES' must be a whole number from 1 to 9999"
  fi
  if [ -n "$TOPOLOGY" ]; then
    [ -f "$TOPOLOGY" ] && [ -r "$TOPOLOGY" ] || die "up: --topology $TOPOLOGY is not a readable file"
    TOPOLOGY="$(realpath -- "$TOPOLOGY")"
  fi
  resolve_node_agent
  compute_expected_nodes
  for tool in openssl curl ss setsid flock etcd base64 sha256sum; do
    command -v "$tool" >/dev/null || bash "$REPO_ROOT/scripts/install-deps.sh" >&2 ||
      die "up: '$tool' missing and scripts/install-deps.sh failed"
  done
  cmd_build
  lock_state_dir
  dir_is_ours_or_empty ||
    die "up: $STATE_DIR exists and was not created by cluster.sh; choose another --state-dir or remove it"

  local t0=$SECONDS
  if [ -f "$STATE_DIR/$MARKER_NAME" ] && control_plane_healthy; then
    info "up: cluster in $STATE_DIR already running (API server https://127.0.0.1:$APISERVER_PORT)"
    if [ -n "$AGENT" ] && ! component_alive node-agent; then
      # shellcheck disable=SC2154
      trap 'rc=$?; if [ $rc -ne 0 ]; then stop_component node-agent 15; fi' EXIT
      start_node_agent "$AGENT" "$EXPECTED"
      trap - EXIT
    fi
    return 0
  fi
  if [ -f "$STATE_DIR/$MARKER_NAME" ]; then
    info "up: stale state in $STATE_DIR (cluster not running), cleaning up"
    stop_all
    rm -rf -- "$STATE_DIR"
  fi

  mkdir -p "$STATE_DIR"/{logs,pids}
  touch "$STATE_DIR/$MARKER_NAME"
  # Whatever fails from here leaves nothing running; logs stay in the state dir for a look.
  # shellcheck disable=SC2154
  trap 'rc=$?; if [ $rc -ne 0 ]; then info "up failed, stopping what was started (logs: $STATE_DIR/logs)"; stop_all; rm -f "$STATE_DIR/cluster.env"; fi' EXIT

  pick_ports
  # With real nodes the API server advertises the host's bridge address: the `kubernetes` Service's endpoint, which
  # pods reach through kube-proxy (an endpoint may not be a loopback address; lib/services.sh relays it to 127.0.0.1).
  if [ "${REAL_NODES:-0}" -gt 0 ]; then
    pick_pod_net
    API_ADVERTISE_ADDR="$POD_NET.1"
  fi
  gen_pki
  gen_tokens
  save_state
  write_kubeconfig "$STATE_DIR/kubeconfig" railyard-admin "$ADMIN_TOKEN"
  write_kubeconfig "$STATE_DIR/controller-manager.kubeconfig" system:kube-controller-manager "$KCM_TOKEN"
  write_kubeconfig "$STATE_DIR/node-agent.kubeconfig" system:railyard-node-agent "$NODE_AGENT_TOKEN"

  info "up: etcd on 127.0.0.1:$ETCD_CLIENT_PORT"
  start_etcd
  info "up: kube-apiserver on https://127.0.0.1:$APISERVER_PORT"
  start_apiserver
  info "up: kube-controller-manager on 127.0.0.1:$KCM_PORT"
  start_controller_manager
  apply_node_agent_rbac
  write_cluster_env

  if [ -n "$AGENT" ]; then
    start_node_agent "$AGENT" "$EXPECTED"
  elif [ "${REAL_NODES:-0}" = 0 ]; then
    info "up: no railyard-node-agent binary (build/bin/railyard-node-agent), control plane only"
  fi
  start_real_nodes
  trap - EXIT
  info "up: ready in $((SECONDS - t0)) s; use: eval \"\$($PROG env --state-dir $STATE_DIR)\""
}

cmd_down() {
  lock_state_dir
  if [ ! -e "$STATE_DIR" ]; then
    info "down: nothing in $STATE_DIR"
    return 0
  fi
  [ -f "$STATE_DIR/$MARKER_NAME" ] ||
    die "down: $STATE_DIR was not created by cluster.sh up; not touching it"
  stop_all
  rm -rf -- "$STATE_DIR"
  info "down: stopped and removed $STATE_DIR"
}

cmd_status() {
  if [ ! -f "$STATE_DIR/$MARKER_NAME" ] || ! load_state; then
    echo "no cluster in $STATE_DIR"
    return 1
  fi
  local ok=0 name pid port health
  printf '%-24s %-8s %-6s %s\n' COMPONENT PID PORT HEALTH
  for name in etcd kube-apiserver kube-controller-manager node-agent; do
    pid=$(component_pid "$name")
    case "$name" in
      etcd) port=$ETCD_CLIENT_PORT ;;
      kube-apiserver) port=$APISERVER_PORT ;;
      kube-controller-manager) port=$KCM_PORT ;;
      node-agent) port="-" ;;
    esac
    if [ "$name" = node-agent ] && [ -z "$pid" ]; then
      printf '%-24s %-8s %-6s %s\n' "$name" - - "not started"
      continue
    fi
    if ! component_alive "$name"; then
      health="not running"
      ok=1
    else
      case "$name" in
        etcd) etcd_healthy && health=healthy || health=unhealthy ;;
        kube-apiserver) apiserver_ready && health=healthy || health=unhealthy ;;
        kube-controller-manager) kcm_healthy && health=healthy || health=unhealthy ;;
        node-agent) health="running ($(ready_sim_nodes) Ready node(s))" ;;
      esac
      [ "$health" = unhealthy ] && ok=1
    fi
    printf '%-24s %-8s %-6s %s\n' "$name" "${pid:--}" "$port" "$health"
  done
  real_nodes_status || ok=1
  echo "kubeconfig: $STATE_DIR/kubeconfig"
  return $ok
}

cmd_env() {
  [ -f "$STATE_DIR/cluster.env" ] || die "env: no running cluster in $STATE_DIR (run: $PROG up --state-dir $STATE_DIR)"
  printf 'export KUBECONFIG=%q\n' "$STATE_DIR/kubeconfig"
  printf 'export PATH=%q:"$PATH"\n' "$CACHE_BIN"
  real_nodes_env
}

cmd_restart_apiserver() {
  lock_state_dir
  [ -f "$STATE_DIR/$MARKER_NAME" ] && load_state ||
    die "restart-apiserver: no cluster in $STATE_DIR (run: $PROG up --state-dir $STATE_DIR)"
  component_alive etcd || die "restart-apiserver: etcd of $STATE_DIR is not running; run down and up again"
  local t0=$SECONDS
  # Open client watches would hold a graceful SIGTERM for about a minute; etcd keeps the data either way.
  stop_component kube-controller-manager 10
  stop_component kube-apiserver 5
  start_apiserver
  # The controller manager's lease informer goes stale across an API-server restart: restart it too.
  start_controller_manager
  info "restart-apiserver: API server and controller manager back in $((SECONDS - t0)) s"
}

cmd_restart_etcd() {
  lock_state_dir
  [ -f "$STATE_DIR/$MARKER_NAME" ] && load_state ||
    die "restart-etcd: no cluster in $STATE_DIR (run: $PROG up --state-dir $STATE_DIR)"
  local t0=$SECONDS
  # Same data dir and ports: etcd ignores --initial-cluster-state for an existing member, so data and revisions
  # survive; the API server reconnects by itself (its watch cache re-watches etcd).
  stop_component etcd 10
  start_etcd
  info "restart-etcd: etcd back in $((SECONDS - t0)) s"
}
