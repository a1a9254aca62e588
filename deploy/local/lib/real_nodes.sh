# shellcheck shell=bash
# Real nodes for cluster.sh (docs/local-cluster.md "Real nodes"): each is a kubelet v1.20 + containerd + runc in a
# mount namespace of its own, with pods on one CNI bridge of this cluster. Sourced by cluster.sh after
# control_plane.sh; uses STATE_DIR, REAL_NODES, CACHE_BIN, REPO_ROOT and the helpers there.
#
# Addresses (all on this machine, routed nowhere else): the bridge ry<port> holds POD_NET.1 (the host's address on the
# pod network: the cluster DNS, and the operator's rendezvous and Prometheus when they run on the host, are reached
# there), POD_NET.2 (the cluster's proxy namespace: Services through kube-proxy, lib/services.sh) and POD_NET.(10+i)
# for node i (its kubelet listens there); pods get POD_NET.32-254 from one host-local pool shared by all nodes.
# Every name and address is derived from the API server's port, so clusters with real nodes run side by side.

REAL_NODE_PREFIX="ry-real"
REAL_WAIT_SECONDS=90

real_node_name() { echo "$REAL_NODE_PREFIX-$1"; }

# POD_NET (a.b.c) and BRIDGE, distinct per cluster (derived from the API server port), on no route of this machine.
pick_pod_net() {
  local n=$((APISERVER_PORT % 200)) tries=0
  while :; do
    POD_NET="10.$((200 + n % 50)).$(((APISERVER_PORT >> 2) % 250)).0"
    POD_NET="${POD_NET%.0}"
    ip route | grep -q "^${POD_NET}\." || break
    n=$((n + 7))
    tries=$((tries + 1))
    [ $tries -lt 50 ] || die "up: no free /24 for the pod network"
  done
  BRIDGE="ry$APISERVER_PORT"
}

real_node_dir() { echo "$STATE_DIR/real/$(real_node_name "$1")"; }
real_node_ip() { echo "$POD_NET.$((10 + $1))"; }
real_sock() { echo "$(real_node_dir "$1")/run/containerd.sock"; }

# The API server's identity towards kubelets (kubectl logs/exec/port-forward), and its RBAC there.
gen_kubelet_client_pki() {
  local pki="$STATE_DIR/pki"
  [ -f "$pki/apiserver-kubelet-client.crt" ] && return 0
  {
    openssl req -newkey rsa:2048 -nodes -sha256 -keyout "$pki/apiserver-kubelet-client.key" \
      -out "$pki/apiserver-kubelet-client.csr" -subj "/O=system:masters/CN=kube-apiserver-kubelet-client"
    printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' \
      >"$pki/client.ext"
    openssl x509 -req -sha256 -days 825 -in "$pki/apiserver-kubelet-client.csr" -CA "$pki/ca.crt" \
      -CAkey "$pki/ca.key" -CAserial "$pki/ca.srl" -extfile "$pki/client.ext" -out "$pki/apiserver-kubelet-client.crt"
  } >>"$STATE_DIR/logs/pki.log" 2>&1 || die "up: openssl failed (see $STATE_DIR/logs/pki.log)"
  chmod 600 "$pki"/*.key
}

# A kubelet's client certificate (system:node:NAME in system:nodes, for the Node authorizer) and its serving
# certificate for its node IP (the API server verifies it: --kubelet-certificate-authority).
gen_node_pki() {
  local i="$1" name ip dir pki="$STATE_DIR/pki"
  name=$(real_node_name "$i")
  ip=$(real_node_ip "$i")
  dir=$(real_node_dir "$i")/pki
  mkdir -p "$dir"
  {
    openssl req -newkey rsa:2048 -nodes -sha256 -keyout "$dir/client.key" -out "$dir/client.csr" \
      -subj "/O=system:nodes/CN=system:node:$name"
    openssl x509 -req -sha256 -days 825 -in "$dir/client.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
      -CAserial "$pki/ca.srl" -extfile "$pki/client.ext" -out "$dir/client.crt"
    openssl req -newkey rsa:2048 -nodes -sha256 -keyout "$dir/serving.key" -out "$dir/serving.csr" -subj "/CN=$name"
    printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:%s,DNS:%s\n' \
      "$ip" "$name" >"$dir/serving.ext"
    openssl x509 -req -sha256 -days 825 -in "$dir/serving.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
      -CAserial "$pki/ca.srl" -extfile "$dir/serving.ext" -out "$dir/serving.crt"
  } >>"$STATE_DIR/logs/pki.log" 2>&1 || die "up: openssl failed for $name (see $STATE_DIR/logs/pki.log)"
  chmod 600 "$dir"/*.key
}

setup_bridge() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge || die "up: cannot create bridge $BRIDGE (needs root with CAP_NET_ADMIN)"
  fi
  # A fixed MAC: a bridge without one takes the smallest MAC of its ports, so it changed whenever a pod's veth came or
  # went, and every pod's ARP entry for POD_NET.1 (the operator's rendezvous, the DNS) pointed at the old one until the
  # kernel probed again: seconds of silence that the rendezvous rightly took for a frozen pod (AgentSilent).
  ip link set "$BRIDGE" address "$(printf '02:72:79:%02x:%02x:01' $((APISERVER_PORT >> 8 & 255)) $((APISERVER_PORT & 255)))"
  ip addr replace "$POD_NET.1/24" dev "$BRIDGE"
  local i
  for ((i = 0; i < REAL_NODES; i++)); do ip addr replace "$(real_node_ip "$i")/24" dev "$BRIDGE"; done
  ip link set "$BRIDGE" up
  echo "$BRIDGE" >"$STATE_DIR/real/bridge"
}

write_node_config() {
  local i="$1" name ip dir
  name=$(real_node_name "$i")
  ip=$(real_node_ip "$i")
  dir=$(real_node_dir "$i")
  mkdir -p "$dir"/{run,root,state,cni,kubelet,logs/pods,logs/containers}
  # One pool for the whole cluster (host-local's file locks keep addresses unique across nodes); no masquerade, no
  # default route: pods reach each other, the host's bridge address and the Service range (via POD_NET.2, the
  # cluster's proxy namespace, where kube-proxy's rules turn a ClusterIP into a pod or the API server relay), nothing
  # else. isGateway false: the bridge's address is set by setup_bridge, and the plugin would otherwise turn on the
  # host's ip_forward, which nothing here needs (the proxy namespace forwards).
  cat >"$dir/cni/10-railyard.conflist" <<EOT
{"cniVersion": "0.4.0", "name": "railyard-$APISERVER_PORT", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": false, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": "$STATE_DIR/real/ipam",
            "ranges": [[{"subnet": "$POD_NET.0/24", "rangeStart": "$POD_NET.32", "rangeEnd": "$POD_NET.254",
                         "gateway": "$POD_NET.1"}]],
            "routes": [{"dst": "$SERVICE_CIDR", "gw": "$POD_NET.2"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOT
  # runc wrapper: root here lacks CAP_SYS_RESOURCE, so a negative oom_score_adj (pod sandboxes get -998) must
  # become 0 before runc applies it (../shared notes: real-nodes.md).
  cat >"$dir/runc" <<'EOT'
#!/bin/sh
bundle=""
prev=""
for a in "$@"; do
  [ "$prev" = "--bundle" ] || [ "$prev" = "-b" ] && bundle="$a"
  prev="$a"
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ] && grep -q '"oomScoreAdj":-' "$bundle/config.json"; then
  sed -i 's/"oomScoreAdj":-[0-9]*/"oomScoreAdj":0/' "$bundle/config.json"
fi
exec runc "$@"
EOT
  chmod +x "$dir/runc"
  cat >"$dir/containerd.toml" <<EOT
version = 2
root = "$dir/root"
state = "$dir/state"
[grpc]
  address = "$dir/run/containerd.sock"
[ttrpc]
  address = "$dir/run/containerd.sock.ttrpc"
[debug]
  level = "warn"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/railyard/pause:3.2"
  enable_selinux = false
  restrict_oom_score_adj = true
  # Pods' network namespaces pinned under the node's state dir, so that nothing of theirs outlives the cluster.
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$dir/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$dir/cni"
EOT
  cat >"$dir/kubelet.yaml" <<EOT
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $ip
port: 10250
healthzBindAddress: $ip
healthzPort: 10248
readOnlyPort: 0
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
tlsCertFile: $dir/pki/serving.crt
tlsPrivateKeyFile: $dir/pki/serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $STATE_DIR/pki/ca.crt}
authorization: {mode: Webhook}
nodeStatusUpdateFrequency: 1s
nodeLeaseDurationSeconds: ${NODE_MONITOR_GRACE:-4}
syncFrequency: 5s
fileCheckFrequency: 5s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {}
evictionPressureTransitionPeriod: 5s
serializeImagePulls: false
makeIPTablesUtilChains: false
maxPods: 32
resolvConf: ""
clusterDomain: cluster.local
clusterDNS: [$POD_NET.1]
EOT
  write_kubeconfig_cert "$dir/kubelet.kubeconfig" "system:node:$name" "$dir/pki/client.crt" "$dir/pki/client.key"
}

write_kubeconfig_cert() {
  local file="$1" user="$2" crt="$3" key="$4"
  cat >"$file" <<EOT
apiVersion: v1
kind: Config
clusters:
- name: railyard-local
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority: $STATE_DIR/pki/ca.crt
users:
- name: $user
  user:
    client-certificate: $crt
    client-key: $key
contexts:
- name: default
  context: {cluster: railyard-local, user: "$user"}
current-context: default
EOT
  chmod 600 "$file"
}

# Node i = containerd + kubelet in one private mount namespace (deploy/local/lib/real_node_run.sh), so that the
# kubelet's fixed /var/log/pods is the node's own and each kubelet's garbage collector sees only its own pods.
start_real_node() {
  local i="$1" name ip dir
  name=$(real_node_name "$i")
  ip=$(real_node_ip "$i")
  dir=$(real_node_dir "$i")
  local unit=$((i / 2))
  start_component "$name" unshare --mount --propagation private -- \
    bash "$REPO_ROOT/deploy/local/lib/real_node_run.sh" "$dir" "$CACHE_BIN/kubelet" \
    --config "$dir/kubelet.yaml" --kubeconfig "$dir/kubelet.kubeconfig" --root-dir "$dir/kubelet" \
    --cert-dir "$dir/pki" --hostname-override "$name" --node-ip "$ip" \
    --container-runtime remote --container-runtime-endpoint "unix://$dir/run/containerd.sock" \
    --runtime-request-timeout 2m \
    --node-labels "railyard.dev/real=true,railyard.dev/unit=unit-$unit,railyard.dev/leaf=leaf-$((unit / 2)),railyard.dev/spine=spine-0,railyard.dev/rails=0" \
    --v 1
}

ready_real_nodes() {
  kubectl_admin get nodes -l railyard.dev/real=true \
    -o jsonpath='{range .items[*]}{range .status.conditions[?(@.type=="Ready")]}{.status}{"\n"}{end}{end}' \
    2>/dev/null | grep -c '^True$' || true
}

start_real_nodes() {
  [ "${REAL_NODES:-0}" -gt 0 ] || return 0
  [ -x "$CACHE_BIN/kubelet" ] || die "up: $CACHE_BIN/kubelet missing (cluster.sh build)"
  for tool in containerd runc ctr unshare ip; do
    command -v "$tool" >/dev/null || die "up: '$tool' missing for real nodes (scripts/install-deps.sh installs it)"
  done
  [ -x /usr/lib/cni/bridge ] || die "up: /usr/lib/cni/bridge missing (apt-get install containernetworking-plugins)"
  mkdir -p "$STATE_DIR/real/ipam"
  [ -n "${POD_NET:-}" ] || pick_pod_net # cmd_up picked it already, before the API server (its advertise address)
  printf 'POD_NET=%q\nBRIDGE=%q\nREAL_NODES=%q\n' "$POD_NET" "$BRIDGE" "$REAL_NODES" >"$STATE_DIR/real/net.env"
  setup_bridge
  gen_kubelet_client_pki
  services_up
  kubectl_admin apply -f - >>"$STATE_DIR/logs/kubectl.log" 2>&1 <<'EOT' || die "up: RBAC for kubelet access failed"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: railyard-local-apiserver-kubelet}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:kubelet-api-admin}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: kube-apiserver-kubelet-client}]
EOT
  local i
  for ((i = 0; i < REAL_NODES; i++)); do
    gen_node_pki "$i"
    write_node_config "$i"
  done
  info "up: building/loading images (deploy/images/build.sh)"
  for ((i = 0; i < REAL_NODES; i++)); do start_real_node "$i"; done
  # Images go into each node's containerd once its socket answers; the kubelet meanwhile registers the node.
  local socks=() deadline=$((SECONDS + 60))
  for ((i = 0; i < REAL_NODES; i++)); do
    until ctr -a "$(real_sock "$i")" version >/dev/null 2>&1; do
      component_gone "$(real_node_name "$i")" && { log_tail "$(real_node_name "$i")"; die "up: node $i exited"; }
      [ $SECONDS -lt $deadline ] || die "up: containerd of node $i not answering after 60 s"
      sleep 0.2
    done
    socks+=(--load "$(real_sock "$i")")
  done
  # The binaries come from RAILYARD_BUILD_DIR (default: the checkout's build/).
  bash "$REPO_ROOT/deploy/images/build.sh" --build-dir "${RAILYARD_BUILD_DIR:-$REPO_ROOT/build}" "${socks[@]}" \
    >>"$STATE_DIR/logs/images.log" 2>&1 || {
    tail -5 "$STATE_DIR/logs/images.log" >&2
    die "up: images failed (log: $STATE_DIR/logs/images.log)"
  }
  deadline=$((SECONDS + REAL_WAIT_SECONDS))
  local ready=0
  while :; do
    ready=$(ready_real_nodes)
    [ "$ready" -ge "$REAL_NODES" ] && break
    [ $SECONDS -lt $deadline ] || {
      # Which node, and what its kubelet said: each node's Ready condition, and the logs of those not Ready.
      kubectl_admin get nodes -l railyard.dev/real=true -o jsonpath='{range .items[*]}{.metadata.name}{" Ready="}{range .status.conditions[?(@.type=="Ready")]}{.status}{" "}{.reason}{": "}{.message}{end}{"\n"}{end}' >&2 2>/dev/null || true
      local n
      for ((n = 0; n < REAL_NODES; n++)); do
        [ "$(kubectl_admin get node "$(real_node_name "$n")" \
          -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null || true)" = True ] ||
          { log_tail "$(real_node_name "$n")"; log_tail "$(real_node_name "$n")-containerd"; }
      done
      die "up: only $ready of $REAL_NODES real nodes Ready after ${REAL_WAIT_SECONDS}s (logs: $STATE_DIR/logs/)"
    }
    sleep 0.5
  done
  start_local_storage
  info "up: $REAL_NODES real node(s) Ready on $BRIDGE ($POD_NET.0/24; host address $POD_NET.1)"
}

# StorageClass railyard-local, the cluster's default, and its provisioner (lib/local_provisioner.sh): claims of it get
# a hostPath directory under STATE/volumes that every node of this machine mounts (docs/storage.md "The local cluster").
start_local_storage() {
  command -v jq >/dev/null || die "up: 'jq' missing for the local provisioner (scripts/install-deps.sh installs it)"
  kubectl_admin apply -f - >>"$STATE_DIR/logs/kubectl.log" 2>&1 <<'EOT' || die "up: StorageClass railyard-local failed"
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: railyard-local
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: railyard.dev/local-hostpath
reclaimPolicy: Delete
volumeBindingMode: Immediate
EOT
  start_component local-provisioner bash "$REPO_ROOT/deploy/local/lib/local_provisioner.sh" "$STATE_DIR" "$CACHE_BIN/kubectl"
}

# Stops node i like a lost machine: kubelet, containerd, shims and every container of the node.
stop_real_node() {
  local i="$1" name sock
  name=$(real_node_name "$i")
  sock=$(real_sock "$i")
  # The shims (and through them the containers) carry the node's socket path in their arguments.
  local shims
  shims=$(pgrep -f "containerd-shim.*-address $sock" || true)
  stop_component "$name" 10
  stop_component "$name-containerd" 10
  # Each container's init is a child of its shim and PID 1 of the container's PID namespace: killing it takes the
  # whole container down, as losing the machine would.
  local s c
  for s in $shims; do
    for c in $(pgrep -P "$s" || true); do kill -KILL "$c" 2>/dev/null || true; done
    kill -KILL "$s" 2>/dev/null || true
  done
}

stop_real_nodes() {
  [ -f "$STATE_DIR/real/net.env" ] || return 0
  # shellcheck disable=SC1091
  source "$STATE_DIR/real/net.env"
  local i
  for ((i = 0; i < REAL_NODES; i++)); do stop_real_node "$i"; done
  stop_component local-provisioner 10
  services_down
  # libcni's result cache (/var/lib/cni/results/<network>-<container>-<ifname>) is machine-wide: drop this cluster's.
  rm -f /var/lib/cni/results/"railyard-${BRIDGE#ry}"-* 2>/dev/null || true
  if [ -n "${BRIDGE:-}" ] && ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE" 2>/dev/null || true; fi
}

# cluster.sh stop-node|start-node NAME
cmd_real_node() {
  local what="$1" name="$2" i
  [ -n "$name" ] || die "$what: give the node's name (kubectl get nodes -l railyard.dev/real=true)"
  lock_state_dir
  load_state && [ -f "$STATE_DIR/real/net.env" ] || die "$what: no cluster with real nodes in $STATE_DIR"
  # shellcheck disable=SC1091
  source "$STATE_DIR/real/net.env"
  for ((i = 0; i < REAL_NODES; i++)); do [ "$(real_node_name "$i")" = "$name" ] && break; done
  [ "$i" -lt "$REAL_NODES" ] || die "$what: '$name' is not a real node of this cluster ($(real_node_name 0) ...)"
  if [ "$what" = stop-node ]; then
    stop_real_node "$i"
    info "stop-node: $name stopped (kubelet, containerd, containers)"
  elif [ "$what" = kill-kubelet ]; then
    # The node's component is the kubelet itself (real_node_run.sh execs it); containerd has its own pid.
    local pid
    pid=$(component_pid "$name")
    pid_is_ours "$pid" || die "kill-kubelet: the kubelet of $name is not running"
    kill -KILL "$pid"
    while pid_is_ours "$pid"; do sleep 0.1; done
    info "kill-kubelet: the kubelet of $name killed; containerd and its containers run on"
  else
    component_alive "$name" && { info "start-node: $name already running"; return 0; }
    start_real_node "$i"
    info "start-node: $name started"
  fi
}

# Lines for `cluster.sh env` and `status`.
real_nodes_env() {
  [ -f "$STATE_DIR/real/net.env" ] || return 0
  # shellcheck disable=SC1091
  source "$STATE_DIR/real/net.env"
  # The host's address on the pod network: what pods dial for services that run on the host (the operator's
  # rendezvous when the operator runs outside the cluster).
  printf 'export RAILYARD_POD_HOST_ADDR=%q\n' "$POD_NET.1"
}

real_nodes_status() {
  [ -f "$STATE_DIR/real/net.env" ] || return 0
  # shellcheck disable=SC1091
  source "$STATE_DIR/real/net.env"
  local i name health rc=0
  for ((i = 0; i < REAL_NODES; i++)); do
    name=$(real_node_name "$i")
    if component_alive "$name" && component_alive "$name-containerd"; then health="running ($(real_node_ip "$i"))"; else
      health="not running"
      rc=1
    fi
    printf '%-24s %-8s %-6s %s\n' "$name" "$(component_pid "$name")" 10250 "$health"
  done
  for name in kube-scheduler apiserver-relay kube-proxy cluster-dns cluster-dns-sync; do
    if component_alive "$name"; then health=running; else
      health="not running"
      rc=1
    fi
    printf '%-24s %-8s %-6s %s\n' "$name" "$(component_pid "$name")" "$([ "$name" = cluster-dns ] && echo 53 || echo -)" "$health"
  done
  return $rc
}

# cluster.sh share NAMESPACE: the PersistentVolumeClaim `railyard-shared` in NAMESPACE, bound to a hostPath volume
# over STATE/shared that every node of this machine sees (ReadWriteMany). On a real cluster the same claim comes from a
# shared filesystem's storage class (NFS, Lustre, a CSI driver); the examples mount it at /shared.
cmd_share() {
  local ns="$1"
  [ -n "$ns" ] || die "share: give the namespace (cluster.sh share NAMESPACE)"
  load_state || die "share: no cluster in $STATE_DIR"
  local dir="$STATE_DIR/shared"
  mkdir -p "$dir/data" "$dir/checkpoints"
  # Workers run as uid 65532 and hostPath volumes ignore fsGroup: the tree is world-writable with the sticky bit, like
  # /tmp, so each job's files stay its own.
  chmod 1777 "$dir" "$dir/data" "$dir/checkpoints"
  kubectl_admin get namespace "$ns" >/dev/null 2>&1 || kubectl_admin create namespace "$ns" >/dev/null
  kubectl_admin apply -f - >>"$STATE_DIR/logs/kubectl.log" 2>&1 <<EOT || die "share: creating the volume failed (see $STATE_DIR/logs/kubectl.log)"
apiVersion: v1
kind: PersistentVolume
metadata: {name: railyard-shared-$ns, labels: {railyard.dev/shared: "true"}}
spec:
  capacity: {storage: 100Gi}
  accessModes: [ReadWriteMany]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: railyard-shared
  hostPath: {path: $dir, type: Directory}
  claimRef: {namespace: $ns, name: railyard-shared}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: railyard-shared, namespace: $ns}
spec:
  accessModes: [ReadWriteMany]
  storageClassName: railyard-shared
  volumeName: railyard-shared-$ns
  resources: {requests: {storage: 100Gi}}
EOT
  # A pod whose claim is not Bound yet waits for the kubelet's next retry (up to about 30 s): return once it is.
  local deadline=$((SECONDS + 60))
  until [ "$(kubectl_admin get pvc railyard-shared -n "$ns" -o jsonpath='{.status.phase}' 2>/dev/null)" = Bound ]; do
    [ $SECONDS -lt $deadline ] || die "share: claim railyard-shared in $ns not Bound after 60 s"
    sleep 0.2
  done
  echo "$dir"
}
