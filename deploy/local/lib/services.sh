# shellcheck shell=bash
# Services for a cluster with real nodes (docs/local-cluster.md "Services and DNS"): what makes a ClusterIP and a
# Service name work inside pods, as kube-proxy and the cluster DNS do on a real cluster. Sourced by cluster.sh after
# real_nodes.sh; uses STATE_DIR, POD_NET, BRIDGE, CACHE_BIN, SERVICE_CIDR, APISERVER_PORT and the helpers there.
#
#   scheduler      kube-scheduler v1.20.2 for pods of schedulerName default-scheduler (the chart's Deployments).
#   service proxy  kube-proxy v1.20.2 (built by `cluster.sh build`) in iptables mode, in the host's network namespace,
#                  which every pod's traffic to a ClusterIP passes through (pods route via the bridge's host address).
#                  One for the machine, not one per node: all real nodes share that namespace here.
#   cluster DNS    dnsmasq on POD_NET.1:53 (the kubelets' clusterDNS), answering NAME.NAMESPACE.svc.cluster.local
#                  from a hosts file that cluster_dns_sync.py keeps equal to the Services' ClusterIPs (a watch);
#                  nothing is forwarded outside. CoreDNS is not packaged in Debian 12.
#
# Machine-wide state it changes, restored at `down`: net.ipv4.ip_forward=1 (the host routes pod -> ClusterIP -> pod
# on the bridge) with FORWARD rules that drop anything between this bridge and another interface, and kube-proxy's
# own net.ipv4.conf.all.route_localnet=1 (the `kubernetes` Service's endpoint is the API server on 127.0.0.1).
# kube-proxy's iptables chains (KUBE-SERVICES, ...) are machine-wide too: one cluster with real nodes at a time.

services_guard_comment() { echo "railyard-$BRIDGE"; }

# A free port in 20000-32767 on 127.0.0.1.
services_pick_port() {
  local p tries=0
  while :; do
    tries=$((tries + 1))
    [ $tries -le 200 ] || die "up: no free port on 127.0.0.1 in 20000-32767"
    p=$((20000 + SRANDOM % 12768))
    port_in_use "$p" || break
  done
  echo "$p"
}

# gen_client_pki NAME USER: a client certificate and kubeconfig under STATE/real/NAME. The built-in bindings give
# system:kube-proxy (system:node-proxier: services, endpoints, endpointslices, nodes, events) and
# system:kube-scheduler (system:kube-scheduler) what they use.
gen_client_pki() {
  local name="$1" user="$2" pki="$STATE_DIR/pki" dir="$STATE_DIR/real/$1"
  mkdir -p "$dir"
  {
    openssl req -newkey rsa:2048 -nodes -sha256 -keyout "$dir/client.key" -out "$dir/client.csr" -subj "/CN=$user"
    openssl x509 -req -sha256 -days 825 -in "$dir/client.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
      -CAserial "$pki/ca.srl" -extfile "$pki/client.ext" -out "$dir/client.crt"
  } >>"$STATE_DIR/logs/pki.log" 2>&1 || die "up: openssl failed for $name (see $STATE_DIR/logs/pki.log)"
  chmod 600 "$dir/client.key"
  write_kubeconfig_cert "$dir/kubeconfig" "$user" "$dir/client.crt" "$dir/client.key"
}

# Another cluster's kube-proxy would rewrite the same chains: name its state dir instead of fighting over them.
services_check_alone() {
  local pid args
  for pid in $(pgrep -x kube-proxy || true); do
    pid_is_ours "$pid" && continue
    args=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)
    die "up: another kube-proxy runs on this machine (pid $pid: ${args:0:200}); its iptables chains are" \
      "machine-wide, so one cluster with real nodes at a time: stop it first (cluster.sh down --state-dir <its dir>)"
  done
  return 0
}

services_up() {
  [ -x "$CACHE_BIN/kube-proxy" ] || die "up: $CACHE_BIN/kube-proxy missing (run cluster.sh build)"
  command -v dnsmasq >/dev/null || die "up: dnsmasq missing (apt-get install dnsmasq-base; scripts/install-deps.sh)"
  [ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null)" = 1 ] ||
    die "up: net.bridge.bridge-nf-call-iptables is not 1 (modprobe br_netfilter; sysctl -w" \
      "net.bridge.bridge-nf-call-iptables=1): replies between pods on one bridge must pass the Service NAT"
  services_check_alone
  local dir="$STATE_DIR/real"
  # Routing on: forwarded only bridge <-> same bridge (pod -> ClusterIP -> pod), never to or from another interface.
  [ -f "$dir/sysctl.prev" ] || printf 'ip_forward=%s\nroute_localnet=%s\n' \
    "$(cat /proc/sys/net/ipv4/ip_forward)" "$(cat /proc/sys/net/ipv4/conf/all/route_localnet)" >"$dir/sysctl.prev"
  local c
  c=$(services_guard_comment)
  iptables -C FORWARD -i "$BRIDGE" ! -o "$BRIDGE" -m comment --comment "$c" -j DROP 2>/dev/null ||
    iptables -I FORWARD -i "$BRIDGE" ! -o "$BRIDGE" -m comment --comment "$c" -j DROP ||
    die "up: iptables FORWARD rule failed (needs root with CAP_NET_ADMIN)"
  iptables -C FORWARD ! -i "$BRIDGE" -o "$BRIDGE" -m comment --comment "$c" -j DROP 2>/dev/null ||
    iptables -I FORWARD ! -i "$BRIDGE" -o "$BRIDGE" -m comment --comment "$c" -j DROP
  echo 1 >/proc/sys/net/ipv4/ip_forward

  # The `kubernetes` Service's endpoint is POD_NET.1:APISERVER_PORT (the API server's advertise address); the API
  # server itself listens on 127.0.0.1 only, so a relay on the bridge address carries the bytes (TLS end to end: the
  # server certificate names the Service's ClusterIP). -L puts the state dir in its arguments (pid_is_ours).
  start_component apiserver-relay socat -L "$dir/apiserver-relay.lock" \
    "TCP-LISTEN:$APISERVER_PORT,bind=$POD_NET.1,reuseaddr,fork" "TCP:127.0.0.1:$APISERVER_PORT"
  # kube-scheduler places the pods of the chart's Deployments (Railyard binds its own worker pods: schedulerName
  # railyard, which the default scheduler leaves alone). No serving port: nothing here reads its /healthz.
  [ -x "$CACHE_BIN/kube-scheduler" ] || die "up: $CACHE_BIN/kube-scheduler missing (run cluster.sh build)"
  gen_client_pki kube-scheduler system:kube-scheduler
  start_component kube-scheduler "$CACHE_BIN/kube-scheduler" --kubeconfig "$dir/kube-scheduler/kubeconfig" \
    --leader-elect=false --port 0 --secure-port 0 --v 1
  gen_client_pki kube-proxy system:kube-proxy
  local healthz metrics
  healthz=$(services_pick_port)
  metrics=$(services_pick_port)
  # conntrack settings 0 = leave the machine's as they are (root here cannot raise nf_conntrack_max anyway).
  start_component kube-proxy "$CACHE_BIN/kube-proxy" --kubeconfig "$dir/kube-proxy/kubeconfig" \
    --proxy-mode iptables --cluster-cidr "$POD_NET.0/24" --hostname-override "railyard-local-proxy" \
    --bind-address 127.0.0.1 --healthz-bind-address "127.0.0.1:$healthz" --metrics-bind-address "127.0.0.1:$metrics" \
    --conntrack-max-per-core 0 --conntrack-min 0 --conntrack-tcp-timeout-established 0 \
    --conntrack-tcp-timeout-close-wait 0 --iptables-min-sync-period 0s --iptables-sync-period 30s --v 1
  echo "$healthz" >"$dir/kube-proxy/healthz-port"

  mkdir -p "$dir/dns"
  : >"$dir/dns/services"
  start_component cluster-dns dnsmasq --keep-in-foreground --log-facility=- --no-resolv --no-hosts --no-poll \
    --bind-interfaces --listen-address="$POD_NET.1" --port=53 --hostsdir="$dir/dns" --local=/cluster.local/ \
    --domain-needed --cache-size=0 --user=nobody --group=nogroup --pid-file=
  start_component cluster-dns-sync python3 "$REPO_ROOT/deploy/local/lib/cluster_dns_sync.py" \
    --kubectl "$CACHE_BIN/kubectl" --kubeconfig "$STATE_DIR/kubeconfig" --out "$dir/dns/services" \
    --apiserver-pid-file "$STATE_DIR/pids/kube-apiserver.pid"

  local deadline=$((SECONDS + 30))
  until curl -fsS "http://127.0.0.1:$healthz/healthz" >/dev/null 2>&1 &&
    iptables -t nat -S KUBE-SERVICES 2>/dev/null | grep -q "default/kubernetes"; do
    component_gone kube-proxy && { log_tail kube-proxy; die "up: kube-proxy exited"; }
    [ $SECONDS -lt $deadline ] || { log_tail kube-proxy; die "up: kube-proxy has no rule for the kubernetes Service after 30 s"; }
    sleep 0.2
  done
  until grep -q "kubernetes.default.svc.cluster.local" "$dir/dns/services"; do
    component_gone cluster-dns && { log_tail cluster-dns; die "up: dnsmasq exited"; }
    component_gone cluster-dns-sync && { log_tail cluster-dns-sync; die "up: cluster_dns_sync.py exited"; }
    [ $SECONDS -lt $deadline ] || { log_tail cluster-dns-sync; die "up: no DNS record of the kubernetes Service after 30 s"; }
    sleep 0.2
  done
  info "up: Services: kube-proxy (iptables) for $SERVICE_CIDR, DNS *.svc.cluster.local on $POD_NET.1:53"
}

services_down() {
  local dir="$STATE_DIR/real"
  stop_component cluster-dns-sync 5
  stop_component cluster-dns 5
  stop_component apiserver-relay 5
  stop_component kube-scheduler 5
  if [ -f "$STATE_DIR/pids/kube-proxy.pid" ]; then
    stop_component kube-proxy 10
    # Its chains outlive it; --cleanup removes every KUBE-* chain and jump it made.
    [ -x "$CACHE_BIN/kube-proxy" ] && "$CACHE_BIN/kube-proxy" --cleanup >>"$STATE_DIR/logs/kube-proxy.log" 2>&1 || true
    # ... except its empty canary chains and the two mark chains (no jump refers to them any more).
    local t ch
    for t in nat filter mangle; do
      for ch in KUBE-PROXY-CANARY KUBE-MARK-DROP KUBE-MARK-MASQ; do
        iptables -t "$t" -F "$ch" 2>/dev/null && iptables -t "$t" -X "$ch" 2>/dev/null || true
      done
    done
  fi
  if [ -n "${BRIDGE:-}" ]; then
    local c
    c=$(services_guard_comment)
    while iptables -D FORWARD -i "$BRIDGE" ! -o "$BRIDGE" -m comment --comment "$c" -j DROP 2>/dev/null; do :; done
    while iptables -D FORWARD ! -i "$BRIDGE" -o "$BRIDGE" -m comment --comment "$c" -j DROP 2>/dev/null; do :; done
  fi
  if [ -f "$dir/sysctl.prev" ]; then
    local ip_forward="" route_localnet=""
    # shellcheck disable=SC1091
    source "$dir/sysctl.prev"
    [ -n "$ip_forward" ] && echo "$ip_forward" >/proc/sys/net/ipv4/ip_forward
    [ -n "$route_localnet" ] && echo "$route_localnet" >/proc/sys/net/ipv4/conf/all/route_localnet
    rm -f "$dir/sysctl.prev"
  fi
  return 0
}
