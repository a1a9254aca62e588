# shellcheck shell=bash
# Services for a cluster with real nodes (docs/local-cluster.md "Services and DNS"): what makes a ClusterIP and a
# Service name work inside pods, as kube-proxy and the cluster DNS do on a real cluster. Sourced by cluster.sh after
# real_nodes.sh; uses STATE_DIR, POD_NET, BRIDGE, CACHE_BIN, SERVICE_CIDR, APISERVER_PORT and the helpers there.
#
#   scheduler      kube-scheduler v1.20.2 for pods of schedulerName default-scheduler (the chart's Deployments).
#   service proxy  kube-proxy v1.20.2 (built by `cluster.sh build`) in iptables mode, in a network namespace of this
#                  cluster's own (railyard-<API server port>), joined to the bridge by a veth pair at POD_NET.2: pods
#                  route the Service range to POD_NET.2, where kube-proxy's rules turn a ClusterIP into a pod or the API
#                  server relay, masquerading every Service connection (--masquerade-all) so that replies come back the
#                  same way. One for the cluster, not one per node: all real nodes share the bridge here.
#   cluster DNS    dnsmasq on POD_NET.1:53 (the kubelets' clusterDNS), answering NAME.NAMESPACE.svc.cluster.local
#                  (a ClusterIP, or a headless Service's pods) and HOSTNAME.NAME.NAMESPACE.svc.cluster.local (a pod
#                  with hostname and subdomain NAME: a TrainingJob's stable names) from a hosts file that
#                  cluster_dns_sync.py keeps equal to the Services and their Endpoints (two watches); nothing is
#                  forwarded outside. CoreDNS is not packaged in Debian 12.
#
# Nothing machine-wide changes: kube-proxy's chains, its route_localnet and the forwarding it needs live in the
# cluster's namespace and go with it at `down`. So clusters with real nodes run side by side (the demo's and the
# tests'); each has its own bridge, pod range, Service range, DNS address and proxy namespace. The host keeps two
# FORWARD rules per bridge that drop anything routed between the bridge and another interface.

services_guard_comment() { echo "railyard-$BRIDGE"; }

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

# The cluster's proxy namespace: kube-proxy's iptables chains and sysctls are per network namespace.
services_netns() { echo "railyard-$APISERVER_PORT"; }
services_veth() { echo "ryp$APISERVER_PORT"; }
in_proxy_netns() { ip netns exec "$(services_netns)" "$@"; }

# The namespace, its end of the veth pair (eth0, POD_NET.2 on the bridge), routing on inside it and no ICMP redirects
# (a Service packet leaves by the interface it came in on; a redirect would teach a pod to bypass the proxy).
setup_proxy_netns() {
  local ns veth
  ns=$(services_netns)
  veth=$(services_veth)
  grep -qw "^$ns" <<<"$(ip netns list)" || ip netns add "$ns" || die "up: cannot create network namespace $ns (needs root)"
  if ! ip link show "$veth" >/dev/null 2>&1; then
    ip -n "$ns" link del eth0 2>/dev/null || true
    ip link add "$veth" type veth peer name eth0 netns "$ns" || die "up: cannot create veth pair $veth"
  fi
  ip link set "$veth" master "$BRIDGE" up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr replace "$POD_NET.2/24" dev eth0
  ip -n "$ns" link set eth0 up
  in_proxy_netns sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.send_redirects=0 \
    net.ipv4.conf.default.send_redirects=0 net.ipv4.conf.eth0.send_redirects=0 >/dev/null ||
    die "up: cannot set forwarding in network namespace $ns"
  echo "$ns" >"$STATE_DIR/real/proxy-netns"
}

services_up() {
  [ -x "$CACHE_BIN/kube-proxy" ] || die "up: $CACHE_BIN/kube-proxy missing (run cluster.sh build)"
  command -v dnsmasq >/dev/null || die "up: dnsmasq missing (apt-get install dnsmasq-base; scripts/install-deps.sh)"
  command -v ip >/dev/null && ip netns list >/dev/null 2>&1 || die "up: 'ip netns' missing (apt-get install iproute2)"
  local dir="$STATE_DIR/real"
  # Nothing routed between this bridge and another interface, whatever the machine's own forwarding does.
  local c
  c=$(services_guard_comment)
  iptables -C FORWARD -i "$BRIDGE" ! -o "$BRIDGE" -m comment --comment "$c" -j DROP 2>/dev/null ||
    iptables -I FORWARD -i "$BRIDGE" ! -o "$BRIDGE" -m comment --comment "$c" -j DROP ||
    die "up: iptables FORWARD rule failed (needs root with CAP_NET_ADMIN)"
  iptables -C FORWARD ! -i "$BRIDGE" -o "$BRIDGE" -m comment --comment "$c" -j DROP 2>/dev/null ||
    iptables -I FORWARD ! -i "$BRIDGE" -o "$BRIDGE" -m comment --comment "$c" -j DROP
  setup_proxy_netns

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
  # From its namespace kube-proxy reaches the API server through the relay on the bridge; the server certificate
  # names `kubernetes` (and 127.0.0.1, the Service IP), not the bridge address, so it verifies that name.
  sed -i -e "s|server: https://127.0.0.1:$APISERVER_PORT|server: https://$POD_NET.1:$APISERVER_PORT\n    tls-server-name: kubernetes|" \
    "$dir/kube-proxy/kubeconfig"
  # Its health and metrics ports are the namespace's own (kube-proxy's defaults); nothing on the host listens there.
  # conntrack settings 0 = leave the machine's as they are (root here cannot raise nf_conntrack_max anyway).
  start_component kube-proxy ip netns exec "$(services_netns)" "$CACHE_BIN/kube-proxy" \
    --kubeconfig "$dir/kube-proxy/kubeconfig" --proxy-mode iptables --masquerade-all \
    --cluster-cidr "$POD_NET.0/24" --hostname-override "railyard-local-proxy" --bind-address "$POD_NET.2" \
    --healthz-bind-address 127.0.0.1:10256 --metrics-bind-address 127.0.0.1:10249 \
    --conntrack-max-per-core 0 --conntrack-min 0 --conntrack-tcp-timeout-established 0 \
    --conntrack-tcp-timeout-close-wait 0 --iptables-min-sync-period 0s --iptables-sync-period 30s --v 1

  mkdir -p "$dir/dns"
  : >"$dir/dns/services"
  start_component cluster-dns dnsmasq --keep-in-foreground --log-facility=- --no-resolv --no-hosts --no-poll \
    --bind-interfaces --listen-address="$POD_NET.1" --port=53 --hostsdir="$dir/dns" --local=/cluster.local/ \
    --domain-needed --cache-size=0 --user=nobody --group=nogroup --pid-file=
  start_component cluster-dns-sync python3 "$REPO_ROOT/deploy/local/lib/cluster_dns_sync.py" \
    --kubectl "$CACHE_BIN/kubectl" --kubeconfig "$STATE_DIR/kubeconfig" --out "$dir/dns/services" \
    --apiserver-pid-file "$STATE_DIR/pids/kube-apiserver.pid"

  local deadline=$((SECONDS + 30))
  until in_proxy_netns curl -fsS "http://127.0.0.1:10256/healthz" >/dev/null 2>&1 &&
    in_proxy_netns iptables -t nat -S KUBE-SERVICES 2>/dev/null | grep -q "default/kubernetes"; do
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
  info "up: Services: kube-proxy (iptables, network namespace $(services_netns) at $POD_NET.2) for $SERVICE_CIDR, DNS *.svc.cluster.local on $POD_NET.1:53"
}

services_down() {
  local dir="$STATE_DIR/real"
  stop_component cluster-dns-sync 5
  stop_component cluster-dns 5
  stop_component apiserver-relay 5
  stop_component kube-scheduler 5
  stop_component kube-proxy 10
  # kube-proxy's chains and sysctls live in the namespace and go with it (the veth pair too).
  local ns
  ns=$(cat "$dir/proxy-netns" 2>/dev/null || true)
  if [ -n "$ns" ] && grep -qw "^$ns" <<<"$(ip netns list)"; then ip netns del "$ns" 2>/dev/null || true; fi
  rm -f "$dir/proxy-netns"
  if [ -n "${BRIDGE:-}" ]; then
    local c
    c=$(services_guard_comment)
    while iptables -D FORWARD -i "$BRIDGE" ! -o "$BRIDGE" -m comment --comment "$c" -j DROP 2>/dev/null; do :; done
    while iptables -D FORWARD ! -i "$BRIDGE" -o "$BRIDGE" -m comment --comment "$c" -j DROP 2>/dev/null; do :; done
  fi
  return 0
}
