#!/usr/bin/env bash
# E2E: two clusters with real nodes on one machine at once (issue #39: the README's `scripts/demo.sh`, whose cluster
# stays up, then `scripts/test.sh`, whose real-node tests bring up clusters of their own). Cluster A stands for the
# demo's, B for a test's; each has 1 real node. Checks:
#   1. B comes up while A runs (until 2026-12-04 it refused: kube-proxy's chains were machine-wide);
#   2. in each cluster at once, a pod resolves kubernetes.default.svc.cluster.local through its cluster's DNS to an
#      address of its own cluster's Service range and connects to it (kube-proxy's DNAT in that cluster's proxy
#      namespace, then the API server relay);
#   3. B taken down, A still answers the same way from a new pod, and nothing of B is left on the machine (its bridge,
#      its proxy namespace, its FORWARD rules).
set -euo pipefail
src=${RAILYARD_SOURCE_DIR:?}
state=${RAILYARD_REAL_STATE_DIR:?}
cluster="$src/deploy/local/cluster.sh"
work=$(mktemp -d /tmp/real-coexist.XXXXXX)
t_all=$SECONDS
log() { echo "[$((SECONDS - t_all))s] $*"; }
fail() {
  echo "FAIL: $*" >&2
  for c in a b; do
    [ -f "$state-$c/kubeconfig" ] || continue
    echo "== cluster $c" >&2
    KUBECONFIG=$state-$c/kubeconfig kubectl get pods -A -o wide >&2 || true
    for p in $(KUBECONFIG=$state-$c/kubeconfig kubectl get pods -n default -o name 2>/dev/null); do
      KUBECONFIG=$state-$c/kubeconfig kubectl logs -n default "$p" --tail 5 >&2 || true
    done
    tail -n 5 "$state-$c"/logs/kube-proxy.log >&2 || true
  done
  exit 1
}
cleanup() {
  bash "$cluster" down --state-dir "$state-b" >/dev/null 2>&1 || true
  bash "$cluster" down --state-dir "$state-a" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

for c in a b; do bash "$cluster" down --state-dir "$state-$c" >/dev/null 2>&1 || true; done
for c in a b; do
  t0=$SECONDS
  bash "$cluster" up --state-dir "$state-$c" --real-nodes 1 >"$work/up-$c.log" 2>&1 ||
    { cat "$work/up-$c.log" >&2; fail "cluster $c up (with the other one running: $(ls -d "$state"-? 2>/dev/null | tr '\n' ' '))"; }
  log "cluster $c with 1 real node up in $((SECONDS - t0)) s"
done

# probe C NAME: a pod in cluster C that resolves the kubernetes Service and opens a TCP connection to it.
probe() {
  KUBECONFIG=$state-$1/kubeconfig kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $2, namespace: default}
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  containers:
    - name: probe
      image: localhost/railyard/worker:0.1.0
      imagePullPolicy: Never
      command: [bash, -c]
      args:
        - |
          for i in \$(seq 1 40); do
            ip=\$(getent hosts kubernetes.default.svc.cluster.local | cut -d' ' -f1)
            if [ -n "\$ip" ] && timeout 3 bash -c "exec 3<>/dev/tcp/\$ip/443"; then echo "connected \$ip"; exit 0; fi
            sleep 0.5
          done
          echo "no connection (last address '\$ip')"; exit 1
YAML
}
# probed C NAME: waits for the probe pod to end and checks it reached an address of C's own Service range.
probed() {
  local kc=$state-$1/kubeconfig phase="" t0=$SECONDS cidr line
  while [ $((SECONDS - t0)) -lt 90 ]; do
    phase=$(KUBECONFIG=$kc kubectl get pod "$2" -n default -o jsonpath='{.status.phase}' 2>/dev/null || true)
    case "$phase" in Succeeded | Failed) break ;; esac
    sleep 0.5
  done
  line=$(KUBECONFIG=$kc kubectl logs "$2" -n default 2>/dev/null | tail -1)
  [ "$phase" = Succeeded ] || fail "cluster $1: probe $2 ended '$phase': $line"
  cidr=$(sed -n 's/^SERVICE_CIDR=//p' "$state-$1/state.env")
  [[ "$line" == "connected ${cidr%.0/24}."* ]] || fail "cluster $1: probe $2 says '$line', want an address in $cidr"
  echo "$line"
}

probe a probe-1
probe b probe-1
a1=$(probed a probe-1)
b1=$(probed b probe-1)
log "both clusters serve the kubernetes Service to their pods at once: A $a1, B $b1"
[ "$(sed -n 's/^SERVICE_CIDR=//p' "$state-a/state.env")" != "$(sed -n 's/^SERVICE_CIDR=//p' "$state-b/state.env")" ] ||
  fail "the two clusters share a Service range"

bridge_b=$(cat "$state-b/real/bridge")
netns_b=$(cat "$state-b/real/proxy-netns")
bash "$cluster" down --state-dir "$state-b" >"$work/down-b.log" 2>&1 || { cat "$work/down-b.log" >&2; fail "cluster b down"; }
! ip link show "$bridge_b" >/dev/null 2>&1 || fail "bridge $bridge_b of cluster b is still there after its down"
! grep -qw "^$netns_b" <<<"$(ip netns list)" || fail "network namespace $netns_b of cluster b is still there after its down"
! grep -q "railyard-$bridge_b" <<<"$(iptables -S FORWARD)" || fail "FORWARD rules of cluster b are still there after its down"
probe a probe-2
a2=$(probed a probe-2)
log "cluster b down and gone; cluster a still serves its pods: $a2"
log "coexist e2e: ok in $((SECONDS - t_all)) s"
