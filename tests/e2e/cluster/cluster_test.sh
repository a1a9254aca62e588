#!/usr/bin/env bash
# End-to-end checks of deploy/local/cluster.sh against the shared fixture cluster (RAILYARD_E2E_STATE_DIR)
# and, for the isolation case, a second cluster of its own.
# usage: cluster_test.sh api_tls|rbac|reflect2|status_env|second_cluster|bad_args
set -euo pipefail

SRC="${RAILYARD_SOURCE_DIR:?RAILYARD_SOURCE_DIR must point at the repo}"
CLUSTER_SH="$SRC/deploy/local/cluster.sh"
STATE="${RAILYARD_E2E_STATE_DIR:-}"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
pass() { echo "ok: $*"; }

need_fixture() {
  [ -n "$STATE" ] || fail "RAILYARD_E2E_STATE_DIR is not set"
  [ -f "$STATE/cluster.env" ] || fail "no cluster.env in $STATE: the e2e_cluster fixture did not come up"
  # shellcheck disable=SC1091
  source "$STATE/cluster.env"
  KUBECTL="$CACHE_BIN/kubectl"
  [ -x "$KUBECTL" ] || fail "kubectl missing in $CACHE_BIN"
  ADMIN_TOKEN=$(awk '$1 == "token:" {print $2}' "$STATE/kubeconfig")
  [ -n "$ADMIN_TOKEN" ] || fail "no token in $STATE/kubeconfig"
}

http_code() { curl -s -o /dev/null -w '%{http_code}' --max-time 10 "$@" || true; }

case_api_tls() {
  need_fixture
  grep -q 'certificate-authority-data: ' "$KUBECONFIG" || fail "kubeconfig lacks certificate-authority-data"
  if grep -q 'insecure-skip-tls-verify' "$KUBECONFIG"; then fail "kubeconfig skips TLS verification"; fi

  local ns
  ns=$("$KUBECTL" get ns -o name)
  grep -qx 'namespace/default' <<<"$ns" || fail "kubectl get ns lacks default: $ns"
  grep -qx 'namespace/kube-system' <<<"$ns" || fail "kubectl get ns lacks kube-system: $ns"
  pass "kubectl (cache) get ns over verified TLS"

  local client server
  client=$("$KUBECTL" version --client --short 2>/dev/null || "$KUBECTL" version --client)
  grep -q 'v1.20.2' <<<"$client" || fail "cached kubectl is not v1.20.2: $client"
  server=$(curl -sf --cacert "$STATE/pki/ca.crt" -H "Authorization: Bearer $ADMIN_TOKEN" "$APISERVER_URL/version")
  grep -q '"gitVersion": "v1.20.2' <<<"$server" || fail "server version not v1.20.2: $server"
  pass "client and server are v1.20.2"

  # The serving certificate must verify against our CA only, and name 127.0.0.1 and localhost.
  local code
  code=$(http_code "$APISERVER_URL/version")
  [ "$code" = "000" ] || fail "TLS without the generated CA should fail verification, got HTTP $code"
  code=$(http_code --cacert "$STATE/pki/ca.crt" -H "Authorization: Bearer $ADMIN_TOKEN" \
    "https://localhost:$APISERVER_PORT/readyz")
  [ "$code" = "200" ] || fail "https://localhost:$APISERVER_PORT/readyz with CA + token gave $code"
  pass "serving cert verifies only with the generated CA (IP and DNS SANs)"

  code=$(http_code --cacert "$STATE/pki/ca.crt" -H "Authorization: Bearer wrong-$ADMIN_TOKEN" "$APISERVER_URL/api")
  [ "$code" = "401" ] || fail "wrong token should give 401, got $code"
  code=$(http_code --cacert "$STATE/pki/ca.crt" "$APISERVER_URL/api/v1/namespaces")
  [ "$code" = "403" ] || fail "anonymous list of namespaces should give 403, got $code"
  pass "wrong token -> 401, anonymous -> 403"

  # Everything listens on loopback only.
  local port addr
  for port in "$APISERVER_PORT" "$ETCD_CLIENT_PORT"; do
    addr=$(ss -Htln "sport = :$port" | awk '{print $4}')
    [ -n "$addr" ] || fail "nothing listens on port $port"
    grep -qv '^127\.0\.0\.1:' <<<"$addr" && fail "port $port listens beyond loopback: $addr"
  done
  pass "API server and etcd listen on 127.0.0.1 only"
}

case_rbac() {
  need_fixture
  local agent_kc="$STATE/node-agent.kubeconfig"
  [ -f "$agent_kc" ] || fail "missing $agent_kc"
  local who out
  who=$("$KUBECTL" --kubeconfig "$agent_kc" auth can-i --list 2>&1 || true)
  # The node agent may do what its ClusterRole grants, never read secrets of kube-system or create RBAC.
  if out=$("$KUBECTL" --kubeconfig "$agent_kc" get secrets -n kube-system 2>&1); then
    fail "node agent user could list secrets in kube-system: $out"
  fi
  grep -qi 'forbidden' <<<"$out" || fail "expected Forbidden for node agent secrets list, got: $out"
  grep -q 'system:railyard-node-agent' <<<"$out" || fail "denial does not name the user: $out"
  if out=$("$KUBECTL" --kubeconfig "$agent_kc" create clusterrolebinding railyard-escalate \
    --clusterrole cluster-admin --user system:railyard-node-agent 2>&1); then
    "$KUBECTL" delete clusterrolebinding railyard-escalate >/dev/null 2>&1 || true
    fail "node agent user could create a cluster-admin binding: $out"
  fi
  grep -qi 'forbidden' <<<"$out" || fail "expected Forbidden for node agent escalation, got: $out"
  pass "node agent user is denied secrets in kube-system and RBAC changes"

  "$KUBECTL" get secrets -n kube-system -o name >/dev/null || fail "admin cannot list secrets in kube-system"
  [ "$("$KUBECTL" auth can-i '*' '*' --all-namespaces)" = "yes" ] || fail "admin is not cluster-admin"
  pass "admin (system:masters) can"

  # The controller manager's serviceaccount controllers run: default SA and its token secret appear.
  local ns="railyard-e2e-rbac-$$"
  "$KUBECTL" create namespace "$ns" >/dev/null
  for _ in $(seq 1 60); do
    "$KUBECTL" get serviceaccount default -n "$ns" -o jsonpath='{.secrets[0].name}' 2>/dev/null | grep -q . && break
    sleep 0.5
  done
  "$KUBECTL" get serviceaccount default -n "$ns" -o jsonpath='{.secrets[0].name}' | grep -q 'default-token-' ||
    fail "no default service account token in new namespace $ns after 30 s"

  # OwnerReferencesPermissionEnforcement is on: a user who may create ConfigMaps but not update the owner's finalizers
  # is refused an ownerReference with blockOwnerDeletion, and allowed the same reference without it. The operator's
  # RBAC needs trainingjobs/finalizers for this (its children set blockOwnerDeletion).
  "$KUBECTL" create role ownerref-probe -n "$ns" --verb=create --resource=configmaps >/dev/null
  "$KUBECTL" create rolebinding ownerref-probe -n "$ns" --role=ownerref-probe --user=ownerref-probe >/dev/null
  local sa_uid
  sa_uid=$("$KUBECTL" get serviceaccount default -n "$ns" -o jsonpath='{.metadata.uid}')
  cm() { # NAME BLOCK: a ConfigMap owned by the namespace's default ServiceAccount
    printf '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"%s","ownerReferences":[{"apiVersion":"v1",
      "kind":"ServiceAccount","name":"default","uid":"%s","blockOwnerDeletion":%s}]}}' "$1" "$sa_uid" "$2"
  }
  if out=$(cm blocking true | "$KUBECTL" create --as ownerref-probe -n "$ns" -f - 2>&1); then
    fail "a user without update on serviceaccounts/finalizers set blockOwnerDeletion (admission plugin off?): $out"
  fi
  grep -q 'cannot set blockOwnerDeletion' <<<"$out" || fail "expected the OwnerReferencesPermissionEnforcement refusal, got: $out"
  out=$(cm plain false | "$KUBECTL" create --as ownerref-probe -n "$ns" -f - 2>&1) ||
    fail "the same user could not create a ConfigMap with a plain ownerReference: $out"
  pass "OwnerReferencesPermissionEnforcement: blockOwnerDeletion needs update on the owner's finalizers"

  "$KUBECTL" delete namespace "$ns" --wait=true --timeout=60s >/dev/null || fail "namespace $ns not deleted"
  pass "controller manager: service account + token controllers, namespace deletion"
  : "$who"
}

case_status_env() {
  need_fixture
  local out
  out=$(bash "$CLUSTER_SH" status --state-dir "$STATE") || fail "status exited non-zero: $out"
  for c in etcd kube-apiserver kube-controller-manager; do
    grep -Eq "^$c +[0-9]+ +[0-9]+ +healthy" <<<"$out" || fail "status does not show $c healthy: $out"
  done
  grep -q "$APISERVER_PORT" <<<"$out" || fail "status does not show API server port $APISERVER_PORT"
  pass "status reports healthy"

  out=$(bash "$CLUSTER_SH" status --state-dir "$STATE/does-not-exist" 2>&1) && fail "status of a missing cluster exited 0"
  grep -q 'no cluster' <<<"$out" || fail "status of a missing cluster says: $out"
  pass "status of a missing cluster fails"

  out=$(bash "$CLUSTER_SH" env --state-dir "$STATE")
  local v
  v=$(env -i HOME="$HOME" PATH=/usr/bin:/bin bash -c "eval \"\$1\"; kubectl version --client --short 2>/dev/null || kubectl version --client; echo \"KC=\$KUBECONFIG\"" _ "$out")
  grep -q 'v1.20.2' <<<"$v" || fail "kubectl after 'env' is not v1.20.2: $v"
  grep -q "KC=$STATE/kubeconfig" <<<"$v" || fail "env does not export KUBECONFIG: $v"
  pass "env puts kubectl v1.20.2 on PATH and sets KUBECONFIG"

  local t0=$SECONDS
  bash "$CLUSTER_SH" build || fail "build with a warm cache failed"
  [ $((SECONDS - t0)) -le 1 ] || fail "build with a warm cache took $((SECONDS - t0)) s"
  pass "warm build is a no-op"
}

# The reflect2 swap in `build`: without it the API server corrupts memory encoding maps (custom resources,
# pretty-printed responses for curl's default User-Agent) and dies.
case_reflect2() {
  need_fixture
  local api_pid crd=crwidgets.e2e.railyard.dev ns="railyard-e2e-reflect2-$$"
  api_pid=$(cat "$STATE/pids/kube-apiserver.pid")
  # shellcheck disable=SC2064
  trap "'$KUBECTL' delete namespace '$ns' --wait=false >/dev/null 2>&1 || true; '$KUBECTL' delete crd '$crd' --wait=false >/dev/null 2>&1 || true" EXIT
  "$KUBECTL" create namespace "$ns" >/dev/null
  "$KUBECTL" apply -f - >/dev/null <<YAML
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: $crd}
spec:
  group: e2e.railyard.dev
  scope: Namespaced
  names: {plural: crwidgets, singular: crwidget, kind: CrWidget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer, default: 3}
              tags: {type: object, additionalProperties: {type: string}}
YAML
  "$KUBECTL" wait --for condition=established --timeout=60s "crd/$crd" >/dev/null || fail "CRD $crd not established"
  local i
  for i in $(seq 1 40); do
    "$KUBECTL" apply -f - >/dev/null 2>&1 <<YAML && break
apiVersion: e2e.railyard.dev/v1
kind: CrWidget
metadata: {name: w1, namespace: $ns, labels: {a: b, c: d}}
spec: {tags: {rail: "0", unit: u1}}
YAML
    [ "$i" -lt 40 ] || fail "could not create a CrWidget"
    sleep 0.5
  done
  local body
  body=$(curl -sf --cacert "$STATE/pki/ca.crt" -H "Authorization: Bearer $ADMIN_TOKEN" \
    "$APISERVER_URL/apis/e2e.railyard.dev/v1/namespaces/$ns/crwidgets/w1") || fail "GET of the custom resource failed"
  grep -Eq '"size": ?3' <<<"$body" || fail "schema default not applied: $body"
  grep -Eq '"unit": ?"u1"' <<<"$body" || fail "map field lost: $body"
  # curl's default User-Agent makes the API server pretty-print built-in objects: a map-encoding path too.
  "$KUBECTL" create configmap cm1 -n "$ns" --from-literal=alpha=1 --from-literal=beta=2 >/dev/null
  body=$(curl -sf --cacert "$STATE/pki/ca.crt" -H "Authorization: Bearer $ADMIN_TOKEN" \
    "$APISERVER_URL/api/v1/namespaces/$ns/configmaps/cm1") || fail "GET of a configmap failed"
  grep -q '"beta": "2"' <<<"$body" || fail "configmap not pretty-printed with its data: $body"
  "$KUBECTL" get crwidgets -n "$ns" -o yaml | grep -q 'rail: "0"' || fail "kubectl get of the custom resource failed"
  if [ "$(cat "$STATE/pids/kube-apiserver.pid")" != "$api_pid" ] || ! kill -0 "$api_pid"; then
    fail "API server $api_pid died handling a custom resource (see $STATE/logs/kube-apiserver.log)"
  fi
  [ "$(curl -s --cacert "$STATE/pki/ca.crt" -H "Authorization: Bearer $ADMIN_TOKEN" "$APISERVER_URL/readyz")" = ok ] ||
    fail "API server not ready after custom resource requests"
  pass "custom resource with defaults and maps, pretty-printed, API server still up"
}

c2_pids() { cat "$1"/pids/*.pid 2>/dev/null | tr '\n' ' '; }

case_second_cluster() {
  need_fixture
  local tmp c2 p1_before
  tmp=$(mktemp -d /tmp/railyard-c2.XXXXXX)
  c2="$tmp/state"
  # Always take the second cluster down, whatever fails.
  trap 'bash "$CLUSTER_SH" down --state-dir "'"$c2"'" >/dev/null 2>&1 || true; rm -rf "'"$tmp"'"' EXIT
  p1_before=$(c2_pids "$STATE")

  local t0=$SECONDS
  bash "$CLUSTER_SH" up --state-dir "$c2" --no-node-agent || fail "second cluster did not come up"
  echo "second cluster up in $((SECONDS - t0)) s"
  (
    # shellcheck disable=SC1091
    source "$c2/cluster.env"
    [ "$APISERVER_PORT" != "$(. "$STATE/cluster.env" && echo "$APISERVER_PORT")" ] || fail "same API server port"
    [ "$ETCD_CLIENT_PORT" != "$(. "$STATE/cluster.env" && echo "$ETCD_CLIENT_PORT")" ] || fail "same etcd port"
  )
  local k1=("$KUBECTL" --kubeconfig "$STATE/kubeconfig") k2=("$KUBECTL" --kubeconfig "$c2/kubeconfig")
  "${k1[@]}" get ns default >/dev/null || fail "first cluster stopped answering"
  "${k2[@]}" get ns default >/dev/null || fail "second cluster does not answer"
  pass "two clusters side by side on different ports"

  # Separate etcd: an object in one is absent in the other; tokens of one are refused by the other.
  "${k2[@]}" create namespace only-in-c2 >/dev/null
  if "${k1[@]}" get ns only-in-c2 >/dev/null 2>&1; then fail "namespace created in cluster 2 visible in cluster 1"; fi
  local tok2 url1 code
  tok2=$(awk '$1 == "token:" {print $2}' "$c2/kubeconfig")
  url1=$(. "$STATE/cluster.env" && echo "$APISERVER_URL")
  code=$(http_code --cacert "$STATE/pki/ca.crt" -H "Authorization: Bearer $tok2" "$url1/api")
  [ "$code" = "401" ] || fail "cluster 2's admin token on cluster 1 should give 401, got $code"
  pass "separate data and credentials"

  # Idempotent up: same processes.
  local pids_a pids_b
  pids_a=$(c2_pids "$c2")
  t0=$SECONDS
  bash "$CLUSTER_SH" up --state-dir "$c2" --no-node-agent || fail "second up on a running cluster failed"
  pids_b=$(c2_pids "$c2")
  [ "$pids_a" = "$pids_b" ] || fail "second up replaced processes: '$pids_a' -> '$pids_b'"
  [ $((SECONDS - t0)) -le 5 ] || fail "second up on a running cluster took $((SECONDS - t0)) s"
  pass "up on a running cluster is a no-op"

  # restart-apiserver keeps the port and the data, gives a new API-server pid.
  local api_a api_b
  api_a=$(cat "$c2/pids/kube-apiserver.pid")
  bash "$CLUSTER_SH" restart-apiserver --state-dir "$c2" || fail "restart-apiserver failed"
  api_b=$(cat "$c2/pids/kube-apiserver.pid")
  [ "$api_a" != "$api_b" ] || fail "restart-apiserver kept pid $api_a"
  if kill -0 "$api_a" 2>/dev/null && tr '\0' ' ' <"/proc/$api_a/cmdline" | grep -qF "$c2"; then
    fail "old API server $api_a still running"
  fi
  "${k2[@]}" get ns only-in-c2 >/dev/null || fail "data lost across restart-apiserver"
  bash "$CLUSTER_SH" status --state-dir "$c2" >/dev/null || fail "status unhealthy after restart-apiserver"
  pass "restart-apiserver keeps port and data"

  # Stale state: a dead API server makes the next up clean up and start afresh.
  local api_pid
  api_pid=$(cat "$c2/pids/kube-apiserver.pid")
  kill -KILL "$api_pid"
  while kill -0 "$api_pid" 2>/dev/null; do sleep 0.1; done
  if bash "$CLUSTER_SH" status --state-dir "$c2" >/dev/null 2>&1; then fail "status healthy with a dead API server"; fi
  bash "$CLUSTER_SH" up --state-dir "$c2" --no-node-agent || fail "up over stale state failed"
  "${k2[@]}" get ns default >/dev/null || fail "cluster 2 not answering after stale restart"
  if "${k2[@]}" get ns only-in-c2 >/dev/null 2>&1; then fail "stale up reused old data"; fi
  pass "up over a dead cluster's state starts afresh"

  # down of cluster 2 removes its processes and dir only.
  local pids2
  pids2=$(c2_pids "$c2")
  [ -n "$pids2" ] || fail "no pids recorded for cluster 2"
  bash "$CLUSTER_SH" down --state-dir "$c2" || fail "down of cluster 2 failed"
  [ ! -e "$c2" ] || fail "down left $c2 behind"
  local p
  for p in $pids2; do
    if [ -r "/proc/$p/cmdline" ] && tr '\0' ' ' <"/proc/$p/cmdline" | grep -qF "$c2"; then
      fail "process $p of cluster 2 still running after down"
    fi
  done
  [ "$(c2_pids "$STATE")" = "$p1_before" ] || fail "first cluster's pids changed"
  for p in $p1_before; do kill -0 "$p" 2>/dev/null || fail "first cluster's process $p died"; done
  bash "$CLUSTER_SH" status --state-dir "$STATE" >/dev/null || fail "first cluster unhealthy after second's down"
  "${k1[@]}" get ns default >/dev/null || fail "first cluster stopped answering after second's down"
  pass "down of cluster 2 left cluster 1 running"
}

case_bad_args() {
  local tmp out
  tmp=$(mktemp -d /tmp/railyard-bad.XXXXXX)
  trap 'rm -rf "'"$tmp"'"' EXIT
  expect_error() {
    local want="$1"
    shift
    if out=$(bash "$CLUSTER_SH" "$@" 2>&1); then fail "cluster.sh $* succeeded"; fi
    grep -q -- "$want" <<<"$out" || fail "cluster.sh $* should mention '$want', said: $out"
    [ "$(wc -l <<<"$out")" -le 3 ] || fail "cluster.sh $* printed more than a short error: $out"
  }
  expect_error "--node-agent /nonexistent" up --state-dir "$tmp/s" --node-agent /nonexistent
  expect_error "--nodes 'zero'" up --state-dir "$tmp/s" --nodes zero
  expect_error "--topology $tmp/none.yaml" up --state-dir "$tmp/s" --topology "$tmp/none.yaml"
  expect_error "unknown option '--bogus'" up --state-dir "$tmp/s" --bogus
  expect_error "unknown command 'frobnicate'" frobnicate
  expect_error "--nodes is an option of 'up' only" down --nodes 3
  local agent="${RAILYARD_BIN_DIR:-}/railyard-node-agent"
  if [ -x "$agent" ]; then
    printf 'units: many\n' >"$tmp/bad-topology.yaml"
    expect_error "bad-topology.yaml rejected by the node agent: .*units" \
      up --state-dir "$tmp/s" --node-agent "$agent" --topology "$tmp/bad-topology.yaml"
  else
    echo "note: no $agent, topology validation through the agent not checked"
  fi
  [ ! -e "$tmp/s" ] || fail "a refused up created $tmp/s"
  mkdir -p "$tmp/foreign" && echo keep >"$tmp/foreign/file"
  expect_error "not created by cluster.sh" down --state-dir "$tmp/foreign"
  [ -f "$tmp/foreign/file" ] || fail "down touched a foreign directory"
  pass "bad arguments give one clear error and change nothing"
}

case "${1:-}" in
  api_tls | rbac | reflect2 | status_env | second_cluster | bad_args) "case_$1" ;;
  *) fail "usage: $0 api_tls|rbac|reflect2|status_env|second_cluster|bad_args" ;;
esac
