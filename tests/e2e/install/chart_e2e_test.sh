#!/usr/bin/env bash
# e2e_install_chart, against the local cluster's real API server:
#  1. the chart rendered for the default and three other value sets (with the cluster's own API versions, as helm
#     does) passes `kubectl apply --dry-run=server`, and so does `kubectl kustomize deploy/` (minus its PDB when the
#     server predates policy/v1);
#  2. the RBAC of the default (cluster scope) and of the namespace-scope release applied for real, then
#     `kubectl auth can-i --as system:serviceaccount:...` grants exactly what the operator and the monitor use and
#     refuses what they must not do;
#  3. railyard-operator run with the namespace-scope ServiceAccount's own token (exactly the shipped Role, ClusterRole
#     and Lease Role) trains the tiny example (deploy/examples/tiny.yaml: agent, rendezvous, checkpoints, progress in
#     status) to Succeeded on the simulated nodes, while railyard-monitor runs with the cluster-scope monitor
#     ServiceAccount's token without a Kubernetes error; `railyard report` then summarises the run from the job's
#     status, its pod's log and its checkpoints.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
: "${KUBECONFIG:?KUBECONFIG must point at the local cluster (run through ctest, or cluster.sh env)}"

ns=railyard-install-e2e        # release namespace
team=railyard-install-team     # job namespace of the namespace-scope release
rel=railyard-e2e               # cluster-scope release
reln=railyard-e2e-ns           # namespace-scope release
op_pid=""
mon_pid=""
cleanup() {
  for p in $op_pid $mon_pid; do kill -9 "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  kubectl delete namespace "$ns" "$team" --wait=false >/dev/null 2>&1 || true
  kubectl delete clusterrole,clusterrolebinding -l "app.kubernetes.io/instance in ($rel,$reln)" >/dev/null 2>&1 || true
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  [ -f "$work/operator.log" ] && { echo "--- operator log (tail)" >&2; tail -30 "$work/operator.log" >&2; }
  kubectl get tj,pods -n "$team" -o wide >&2 2>/dev/null || true
  exit 1
}

install_crd "$src" || fail "installing the CRD"
for n in "$ns" "$team"; do fresh_namespace "$n"; done

# What helm install would see: the server's version and its API group/versions.
apis=$(kubectl api-versions | paste -sd, -)
kver=$(kubectl version -o json 2>/dev/null | jq -r .serverVersion.gitVersion)
cluster_render() { # OUT RELEASE [flags]
  local out=$1 r=$2
  shift 2
  "$minihelm" template "$chart" --name "$r" --namespace "$ns" --only-api-versions --api-versions "$apis" \
    --kube-version "$kver" "$@" >"$out"
}
sed "s/team-a/$team/g" "$values_dir/namespace-scope.yaml" >"$work/namespace-scope.yaml"

jqe() { jq -e "$@" >/dev/null; }
# --- 1. server-side dry runs -------------------------------------------------------------------------------------
dry_run() { kubectl apply --dry-run=server -f "$1" >"$work/dry.out" 2>&1 || { cat "$work/dry.out" >&2; return 1; }; }
cluster_render "$work/default.yaml" "$rel" --include-crds || fail "default values do not render"
check "default values: kubectl apply --dry-run=server" dry_run "$work/default.yaml"
check "default values: the PDB uses the API version the server has (policy/v1 only from 1.21)" \
  jqe -s --arg apis "$apis" '[.[] | select(.kind == "PodDisruptionBudget") | .apiVersion] ==
    [if ($apis | split(",") | index("policy/v1")) then "policy/v1" else "policy/v1beta1" end]' \
  <("$minihelm" yaml2json "$work/default.yaml")
cluster_render "$work/ns.yaml" "$reln" -f "$work/namespace-scope.yaml" || fail "namespace-scope values do not render"
check "namespace-scope values: kubectl apply --dry-run=server" dry_run "$work/ns.yaml"
cluster_render "$work/nomon.yaml" "$rel" -f "$values_dir/no-monitor.yaml" || fail "no-monitor values do not render"
check "no-monitor values: kubectl apply --dry-run=server" dry_run "$work/nomon.yaml"
cluster_render "$work/po.yaml" "$rel" -f "$values_dir/prometheus-operator.yaml" ||
  fail "prometheus-operator values do not render"
if grep -q "monitoring.coreos.com/v1" <<<"${apis//,/$'\n'}"; then
  check "prometheus-operator values: kubectl apply --dry-run=server" dry_run "$work/po.yaml"
else
  # The local cluster has no prometheus-operator: the gated objects must be left out, so that the rest applies.
  check "prometheus-operator values: no monitoring.coreos.com objects on a cluster without them" \
    bash -c "! grep -q 'apiVersion: monitoring.coreos.com' '$work/po.yaml'"
  sed -i "s/namespace: monitoring/namespace: $ns/" "$work/po.yaml"
  check "prometheus-operator values: kubectl apply --dry-run=server" dry_run "$work/po.yaml"
fi
kubectl kustomize "$src/deploy" >"$work/kustomize.yaml"
if ! grep -qx policy/v1 <<<"${apis//,/$'\n'}"; then # a pre-1.21 server: no policy/v1 PodDisruptionBudget
  "$minihelm" yaml2json "$work/kustomize.yaml" | jq -c 'select(.kind != "PodDisruptionBudget")' >"$work/kustomize.json"
  mv "$work/kustomize.json" "$work/kustomize.yaml"
fi
# The Namespace is only created in a dry run, so the objects in it would not find it: create it for real first.
kubectl get namespace railyard-system >/dev/null 2>&1 || kubectl create namespace railyard-system >/dev/null
check "kubectl kustomize deploy/ | kubectl apply --dry-run=server" dry_run "$work/kustomize.yaml"

# --- 2. RBAC for real, then kubectl auth can-i ---------------------------------------------------------------------
rbac_only() { "$minihelm" yaml2json "$1" | jq -c 'select(.kind | test("^(ServiceAccount|(Cluster)?Role(Binding)?)$"))'; }
rbac_only "$work/default.yaml" | kubectl apply -f - >/dev/null || fail "applying the default RBAC"
rbac_only "$work/ns.yaml" | kubectl apply -f - >/dev/null || fail "applying the namespace-scope RBAC"
can() { # yes|no SA VERB RESOURCE [kubectl auth can-i flags]
  local want=$1 sa=$2
  shift 2
  local got
  got=$(kubectl auth can-i --as "system:serviceaccount:$ns:$sa" "$@" 2>/dev/null || true)
  [ "$got" = "$want" ] && return 0
  echo "  $sa: can-i $* = '$got', want $want" >&2
  return 1
}
op=$rel-operator
mon=$rel-monitor
# Everything the operator calls (docs/operator.md "RBAC the operator needs"), in any namespace.
for v in get list watch patch delete; do check "operator may $v trainingjobs" can yes "$op" "$v" trainingjobs.railyard.dev -A; done
check "operator may update trainingjobs/status" can yes "$op" update trainingjobs.railyard.dev --subresource=status -n "$team"
# Its children's ownerReferences set blockOwnerDeletion: with OwnerReferencesPermissionEnforcement that needs this.
check "operator may update trainingjobs/finalizers" can yes "$op" update trainingjobs.railyard.dev --subresource=finalizers -n "$team"
check "operator may not patch trainingjobs/finalizers" can no "$op" patch trainingjobs.railyard.dev --subresource=finalizers -n "$team"
for v in get list watch create delete; do check "operator may $v pods" can yes "$op" "$v" pods -A; done
check "operator may create pods/binding" can yes "$op" create pods --subresource=binding -n "$team"
for v in get create patch delete; do check "operator may $v secrets in a job namespace" can yes "$op" "$v" secrets -n "$team"; done
check "operator may get its rendezvous CA Secret" can yes "$op" get "secret/$rel-rendezvous-ca" -n "$ns"
# Namespace scope: in its own namespace the operator reads only its CA Secret (and may create it on first start).
check "namespace scope: operator may get its rendezvous CA Secret" can yes "$reln-operator" get "secret/$reln-rendezvous-ca" -n "$ns"
check "namespace scope: operator may create its rendezvous CA Secret" can yes "$reln-operator" create secrets -n "$ns"
check "namespace scope: operator may not get other Secrets of its namespace" can no "$reln-operator" get secret/other -n "$ns"
# The rendezvous Service's Endpoints, which the leader writes (--leader-endpoints): that name only, and create.
for v in get update; do
  check "operator may $v the rendezvous Endpoints" can yes "$op" "$v" "endpoints/$rel-rendezvous" -n "$ns"
done
check "operator may create Endpoints in its namespace" can yes "$op" create endpoints -n "$ns"
check "operator may not update other Endpoints" can no "$op" update endpoints/other -n "$ns"
check "operator may not touch Endpoints in a job namespace" can no "$op" update "endpoints/$rel-rendezvous" -n "$team"
for v in get list watch; do check "operator may $v nodes" can yes "$op" "$v" nodes; done
for v in list watch; do check "operator may $v priorityclasses" can yes "$op" "$v" priorityclasses.scheduling.k8s.io; done
check "operator may not create priorityclasses" can no "$op" create priorityclasses.scheduling.k8s.io
for v in create patch; do check "operator may $v events" can yes "$op" "$v" events -n "$team"; done
for v in get create update delete; do check "operator may $v networkpolicies in a job namespace" can yes "$op" "$v" networkpolicies.networking.k8s.io -n "$team"; done
for v in get create update; do check "operator may $v leases in $ns" can yes "$op" "$v" leases.coordination.k8s.io -n "$ns"; done
# ... and nothing else.
check "operator may not delete nodes" can no "$op" delete nodes
check "operator may not patch nodes" can no "$op" patch nodes
check "operator may not list secrets" can no "$op" list secrets -A
check "operator may not watch secrets" can no "$op" watch secrets -n "$team"
check "operator may not update secrets" can no "$op" update secrets -n "$team"
check "operator may not update pods (no pod writes besides create/delete/binding)" can no "$op" update pods -n "$team"
check "operator may not create pods/exec" can no "$op" create pods --subresource=exec -n "$team"
check "operator may not update trainingjobs (spec)" can no "$op" update trainingjobs.railyard.dev -n "$team"
check "operator may not create trainingjobs" can no "$op" create trainingjobs.railyard.dev -n "$team"
check "operator may not touch leases outside $ns" can no "$op" update leases.coordination.k8s.io -n kube-system
check "operator may not get namespaces (its start-up check tolerates that)" can no "$op" get "namespace/$ns"
check "operator may not create deployments" can no "$op" create deployments.apps -n "$ns"
check "operator may not create clusterroles" can no "$op" create clusterroles.rbac.authorization.k8s.io
for v in get create update delete; do check "operator may $v configmaps in a job namespace" can yes "$op" "$v" configmaps -n "$team"; done
check "operator may not list configmaps" can no "$op" list configmaps -A
check "operator may not patch configmaps" can no "$op" patch configmaps -n "$team"
check "operator may not list networkpolicies" can no "$op" list networkpolicies.networking.k8s.io -A
for v in get list watch create delete; do check "operator may $v services in a job namespace" can yes "$op" "$v" services -n "$team"; done
check "operator may not update services (a job's Service is never rewritten)" can no "$op" update services -n "$team"
check "operator may not patch services" can no "$op" patch services -n "$team"
# The monitor (docs/monitor.md).
for v in get list patch; do check "monitor may $v trainingjobs" can yes "$mon" "$v" trainingjobs.railyard.dev -A; done
for v in create patch; do check "monitor may $v events" can yes "$mon" "$v" events -n "$team"; done
check "monitor may list pods (embedded mode)" can yes "$mon" list pods -A
check "monitor may not watch trainingjobs" can no "$mon" watch trainingjobs.railyard.dev -A
check "monitor may not delete trainingjobs" can no "$mon" delete trainingjobs.railyard.dev -n "$team"
check "monitor may not update trainingjobs/status" can no "$mon" update trainingjobs.railyard.dev --subresource=status -A
check "monitor may not update trainingjobs/finalizers" can no "$mon" update trainingjobs.railyard.dev --subresource=finalizers -A
check "monitor may not get pods" can no "$mon" get pods -n "$team"
check "monitor may not read secrets" can no "$mon" get secrets -n "$team"
check "monitor may not list nodes" can no "$mon" list nodes
# The users' roles, through the built-in ones (kube-controller-manager's clusterrole-aggregation controller copies
# railyard-edit's rules into edit and admin, railyard-view's into view): alice edits, bob views, carol administers $team.
kubectl create rolebinding ry-alice-edit --clusterrole=edit --user=alice -n "$team" >/dev/null
kubectl create rolebinding ry-bob-view --clusterrole=view --user=bob -n "$team" >/dev/null
kubectl create rolebinding ry-carol-admin --clusterrole=admin --user=carol -n "$team" >/dev/null
user_can() { # yes|no USER VERB RESOURCE [flags]
  local want=$1 user=$2 got
  shift 2
  got=$(kubectl auth can-i --as "$user" "$@" 2>/dev/null || true)
  [ "$got" = "$want" ] && return 0
  echo "  $user: can-i $* = '$got', want $want" >&2
  return 1
}
wait_for 60 "the aggregation of railyard-edit into edit" \
  user_can yes alice create trainingjobs.railyard.dev -n "$team"
for v in get list watch create update patch delete deletecollection; do
  check "edit (alice) may $v trainingjobs" user_can yes alice "$v" trainingjobs.railyard.dev -n "$team"
done
check "edit (alice) may scale trainingjobs" user_can yes alice update trainingjobs.railyard.dev --subresource=scale -n "$team"
check "edit (alice) may not write trainingjobs/status" \
  user_can no alice update trainingjobs.railyard.dev --subresource=status -n "$team"
check "edit (alice) may not touch trainingjobs in another namespace" user_can no alice create trainingjobs.railyard.dev -n "$ns"
wait_for 60 "the aggregation of railyard-edit into admin" user_can yes carol delete trainingjobs.railyard.dev -n "$team"
wait_for 60 "the aggregation of railyard-view into view" user_can yes bob list trainingjobs.railyard.dev -n "$team"
for v in get list watch; do check "view (bob) may $v trainingjobs" user_can yes bob "$v" trainingjobs.railyard.dev -n "$team"; done
for v in create patch delete; do check "view (bob) may not $v trainingjobs" user_can no bob "$v" trainingjobs.railyard.dev -n "$team"; done
check "view (bob) may not scale trainingjobs" user_can no bob update trainingjobs.railyard.dev --subresource=scale -n "$team"
# Namespace scope: the same verbs, only in the job namespace.
opn=$reln-operator
check "namespace scope: operator may list trainingjobs in $team" can yes "$opn" list trainingjobs.railyard.dev -n "$team"
check "namespace scope: operator may create pods in $team" can yes "$opn" create pods -n "$team"
check "namespace scope: operator may update trainingjobs/finalizers in $team" \
  can yes "$opn" update trainingjobs.railyard.dev --subresource=finalizers -n "$team"
check "namespace scope: operator may not update trainingjobs/finalizers in default" \
  can no "$opn" update trainingjobs.railyard.dev --subresource=finalizers -n default
check "namespace scope: operator may still list nodes" can yes "$opn" list nodes
# NodeResourcesFit: every pod bound to a node counts, whatever its namespace (read only).
for v in list watch; do check "namespace scope: operator may $v pods cluster-wide" can yes "$opn" "$v" pods -A; done
check "namespace scope: operator may not create pods in default" can no "$opn" create pods -n default
check "namespace scope: operator may not list trainingjobs cluster-wide" can no "$opn" list trainingjobs.railyard.dev -A
check "namespace scope: operator may not get secrets in default" can no "$opn" get secrets -n default
check "namespace scope: monitor may not list pods (Prometheus mode)" can no "$reln-monitor" list pods -n "$team"
check "namespace scope: monitor may patch trainingjobs in $team" can yes "$reln-monitor" patch trainingjobs.railyard.dev -n "$team"
check "namespace scope: worker ServiceAccount mounts no token" \
  test "$(kubectl get sa railyard-worker -n "$team" -o jsonpath='{.automountServiceAccountToken}')" = false

# --- 3. the operator with exactly the shipped namespace-scope RBAC runs a job --------------------------------------
[ "$(kubectl get nodes -o name | wc -l)" -ge 2 ] || fail "the cluster has fewer than 2 nodes (start it with the node agent)"
sa_kubeconfig() { # SA OUT: the admin kubeconfig with the ServiceAccount's token instead of the admin's
  wait_for 60 "the token Secret of $1" bash -c "kubectl get sa $1 -n $ns -o jsonpath='{.secrets[0].name}' | grep -q ."
  local token
  token=$(kubectl get secret -n "$ns" "$(kubectl get sa "$1" -n "$ns" -o jsonpath='{.secrets[0].name}')" \
    -o jsonpath='{.data.token}' | base64 -d)
  sed "s|^\(\s*\)token: .*|\1token: $token|" "$KUBECONFIG" >"$2"
  ! cmp -s "$KUBECONFIG" "$2" || fail "$2: could not put the token of $1 into the kubeconfig"
}
sa_kubeconfig "$opn" "$work/operator.kubeconfig"
sa_kubeconfig "$mon" "$work/monitor.kubeconfig"
# The chart's own arguments for this release, with loopback addresses and the local worker binary instead of images.
mapfile -t args < <("$minihelm" yaml2json "$work/ns.yaml" | jq -r 'select(.kind == "Deployment" and
  .metadata.name == "'"$opn"'") | .spec.template.spec.containers[0].args[]' |
  grep -vE '^--(metrics-addr|health-addr|rendezvous-bind|rendezvous-addr|worker-command|worker-image)=')
# The operator with its ServiceAccount's token and the chart's arguments (local binary, loopback addresses); the pod
# fields the chart gives it from the downward API (POD_IP, POD_NAME, POD_UID) for the Endpoints it writes as leader
# (an address the API server accepts in Endpoints: not loopback; nothing dials it here).
start_operator() {
  # RAILYARD_OPERATOR_LOG_ARCHIVE=FILE keeps every run's log (when debugging; $work goes with the test).
  [ -z "${RAILYARD_OPERATOR_LOG_ARCHIVE:-}" ] || [ ! -f "$work/operator.log" ] ||
    { echo "=== $(date +%T)"; cat "$work/operator.log"; } >>"$RAILYARD_OPERATOR_LOG_ARCHIVE"
  POD_IP=10.255.255.1 POD_NAME=operator-e2e POD_UID=00000000-0000-0000-0000-00000000e2e0 \
    "$bin/railyard-operator" --kubeconfig "$work/operator.kubeconfig" "${args[@]}" --metrics-addr 127.0.0.1:0 \
    --health-addr 127.0.0.1:0 --rendezvous-bind 127.0.0.1:0 --worker-command "$bin/railyard-worker" \
    --lease-duration 4 --renew-deadline 3 --retry-period 1 >"$work/operator.log" 2>&1 &
  op_pid=$!
}
# job_flow NAME SECONDS: the operator, with its ServiceAccount's token, runs a 2-replica job NAME to Succeeded with its
# Secret, bound pods and Events. Returns 1 (and says which step) if any of that does not happen within SECONDS.
job_flow() {
  local name=$1 limit=$2 t0=$SECONDS step=""
  start_operator
  cat <<YAML | kubectl apply -n "$team" -f - >/dev/null
apiVersion: railyard.dev/v1alpha1
kind: TrainingJob
metadata: {name: $name}
spec:
  replicas: 2
  device: cpu
  model: {preset: tiny}
  data: {train: /tmp/none/train_*.bin}
  training: {steps: 10, globalBatch: 12, microBatch: 1}
  template:
    spec:
      containers:
        - command: ["sh", "-c", "sleep 1; exit 0"]
YAML
  for step in "the operator leads" "the job Succeeded" "the Secret, the bound pods and the job's Events exist"; do
    until case $step in
      "the operator leads") grep -q "leading: reconciling" "$work/operator.log" ;;
      "the job Succeeded") [ "$(kubectl get tj "$name" -n "$team" -o jsonpath='{.status.phase}')" = Succeeded ] ;;
      *) kubectl get secret "$name-rendezvous" -n "$team" >/dev/null 2>&1 &&
        kubectl get pods -n "$team" -l "railyard.dev/job=$name" -o jsonpath='{.items[*].spec.nodeName}' | grep -q . &&
        kubectl get events -n "$team" --field-selector "involvedObject.name=$name" -o name | grep -q . ;;
      esac; do
      if [ $((SECONDS - t0)) -ge "$limit" ]; then
        echo "  $name: not within ${limit}s: $step" >&2
        stop_operator
        return 1
      fi
      sleep 0.3
    done
  done
  stop_operator
}
# tiny_flow LIMIT: the same operator trains the tiny example as shipped (data and checkpoint paths pointed at this
# test's files) to Succeeded with 200/200 steps; returns 1 naming what did not happen within LIMIT seconds.
tiny_flow() {
  local limit=$1 t0=$SECONDS phase=""
  start_operator
  sed -e "s|/shared/data/|$work/data/|g" -e "s|/shared/checkpoints/tiny|$work/ckpt|" \
    <(python3 "$src/tests/e2e/lib/example_on_claim.py" "$src/deploy/examples/tiny.yaml") | kubectl apply -n "$team" -f - >/dev/null
  until [ "$phase" = Succeeded ]; do
    phase=$(kubectl get tj tiny -n "$team" -o jsonpath='{.status.phase}')
    case $phase in Failed | Invalid)
      echo "  tiny: $phase: $(kubectl get tj tiny -n "$team" -o jsonpath='{.status.conditions[-1].message}')" >&2
      stop_operator
      return 1 ;;
    esac
    [ $((SECONDS - t0)) -lt "$limit" ] || { echo "  tiny: not Succeeded within ${limit}s ($phase)" >&2; stop_operator; return 1; }
    sleep 0.5
  done
  echo "  tiny: Succeeded after $((SECONDS - t0)) s"
  stop_operator
  [ "$(kubectl get tj tiny -n "$team" -o jsonpath='{.status.progress}')" = 200/200 ] ||
    { echo "  tiny: progress $(kubectl get tj tiny -n "$team" -o jsonpath='{.status.progress}')" >&2; return 1; }
}
# SIGTERM, then SIGKILL after 5 s: an operator whose informers never sync (no list rights) does not act on SIGTERM.
stop_operator() {
  kill "$op_pid" 2>/dev/null
  for _ in $(seq 50); do kill -0 "$op_pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$op_pid" 2>/dev/null
  wait "$op_pid" 2>/dev/null
  op_pid=""
}
# The cluster-scope monitor (embedded mode: it lists pods) with its own token, limited to the job namespace so that it
# never judges other tests' jobs.
"$bin/railyard-monitor" --kubeconfig "$work/monitor.kubeconfig" --namespace "$team" --listen 127.0.0.1:0 \
  --interval 0.5 >"$work/monitor.log" 2>&1 &
mon_pid=$!
"$bin/railyard" data prepare --input /usr/share/common-licenses/* --output "$work/data" >/dev/null ||
  fail "railyard data prepare"
check "the operator with exactly the shipped namespace-scope RBAC trains the tiny example to Succeeded" tiny_flow 240
check "the operator logged no Forbidden" bash -c "! grep -qi forbidden '$work/operator.log'"
endpoints_written() {
  [ "$(kubectl get endpoints "$reln-rendezvous" -n "$ns" -o jsonpath='{.subsets[0].addresses[0].ip}/{.subsets[0].addresses[0].targetRef.name}')" = 10.255.255.1/operator-e2e ] && return 0
  grep -E 'Endpoints|rendezvous Service|leader' "$work/operator.log" >&2 || true
  return 1
}
check "as leader, the operator wrote the rendezvous Endpoints with its own address (the shipped Role suffices)" endpoints_written

# The operator's /metrics as the chart serves it (operator.metricsSecure, default true): HTTPS, and only to a token
# whose user the API server says may get /metrics. Asked with the operator's own token (the shipped RBAC lets it
# create the reviews), answered for three callers: none, a ServiceAccount without the right, one bound to the chart's
# ClusterRole <release>-metrics-reader. Then with a certificate of ours (--metrics-cert-dir), verified by curl.
sa_token() { # SA: its token (the token Secret the controller manager makes for it)
  wait_for 60 "the token Secret of $1" bash -c "kubectl get sa $1 -n $ns -o jsonpath='{.secrets[0].name}' | grep -q ."
  kubectl get secret -n "$ns" "$(kubectl get sa "$1" -n "$ns" -o jsonpath='{.secrets[0].name}')" \
    -o jsonpath='{.data.token}' | base64 -d
}
kubectl create serviceaccount metrics-reader-e2e -n "$ns" >/dev/null
kubectl create serviceaccount metrics-other-e2e -n "$ns" >/dev/null
kubectl create clusterrolebinding "$reln-metrics-reader-e2e" --clusterrole "$reln-metrics-reader" \
  --serviceaccount "$ns:metrics-reader-e2e" >/dev/null
kubectl label clusterrolebinding "$reln-metrics-reader-e2e" app.kubernetes.io/instance="$reln" >/dev/null
reader_token=$(sa_token metrics-reader-e2e)
other_token=$(sa_token metrics-other-e2e)
metrics_url() { # the https URL of /metrics the running operator logged (serving metrics=HOST:PORT metrics_tls=on)
  local addr=""
  for _ in $(seq 100); do
    addr=$(grep -oE 'metrics=[0-9.]+:[0-9]+ metrics_tls=on' "$work/operator.log" | head -1 | cut -d' ' -f1 | cut -d= -f2)
    [ -n "$addr" ] && break
    sleep 0.1
  done
  echo "https://$addr/metrics"
}
status_of() { curl -s -o "$work/metrics.out" -w '%{http_code}' --max-time 10 "$@"; }
secure_metrics() {
  local url code
  url=$(metrics_url)
  [[ $url != https:///metrics ]] || { echo "  the operator logged no metrics address with metrics_tls=on" >&2; return 1; }
  code=$(status_of -k "$url")
  [ "$code" = 401 ] || { echo "  no token: HTTP $code, want 401" >&2; return 1; }
  code=$(status_of -k -H "Authorization: Bearer not-a-token" "$url")
  [ "$code" = 401 ] || { echo "  a made-up token: HTTP $code, want 401" >&2; return 1; }
  code=$(status_of -k -H "Authorization: Bearer $other_token" "$url")
  [ "$code" = 403 ] && grep -q "may not get /metrics" "$work/metrics.out" ||
    { echo "  a token without the right: HTTP $code ($(cat "$work/metrics.out")), want 403" >&2; return 1; }
  code=$(status_of -k -H "Authorization: Bearer $reader_token" "$url")
  [ "$code" = 200 ] && grep -q '^railyard_operator_jobs' "$work/metrics.out" ||
    { echo "  the metrics reader: HTTP $code, want 200 with railyard_operator_jobs" >&2; return 1; }
  code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 "${url/https:/http:}")
  [ "$code" != 200 ] || { echo "  plain HTTP served /metrics" >&2; return 1; }
}
start_operator
check "--metrics-secure (the chart's default): 401 without or with a made-up token, 403 without the right, 200 for the metrics reader, no plain HTTP" secure_metrics
stop_operator || true # (its kill -9 of an operator that already stopped fails)
mkdir -p "$work/metrics-tls"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=127.0.0.1 \
  -addext subjectAltName=IP:127.0.0.1 -keyout "$work/metrics-tls/tls.key" -out "$work/metrics-tls/tls.crt" 2>/dev/null ||
  fail "openssl: a certificate for --metrics-cert-dir"
chart_args=("${args[@]}")
args+=(--metrics-cert-dir "$work/metrics-tls")
start_operator
own_cert() {
  local code
  code=$(status_of --cacert "$work/metrics-tls/tls.crt" -H "Authorization: Bearer $reader_token" "$(metrics_url)")
  [ "$code" = 200 ] || { echo "  with our certificate verified: HTTP $code, want 200" >&2; return 1; }
}
check "--metrics-cert-dir: the operator serves the mounted certificate (curl verifies it) to the metrics reader" own_cert
stop_operator || true
args=("${chart_args[@]}")
# What a user has after the run: the job's status, the pod's log (kubectl logs; the node agent keeps it in its state
# directory) and the checkpoint directory. The report must agree with the status.
kubectl get tj tiny -n "$team" -o json >"$work/tiny.json"
podlog=$(ls "${RAILYARD_E2E_STATE_DIR:?}/node-agent/pods/${team}_tiny-worker-0/"*.log 2>/dev/null | head -1)
report_of_tiny() {
  [ -n "$podlog" ] || { echo "  no log of pod tiny-worker-0 under the node agent's state" >&2; return 1; }
  "$bin/railyard" report --log "$podlog" --status "$work/tiny.json" --checkpoints "$work/ckpt" \
    --output "$work/tiny.html" >/dev/null || return 1
  grep -A1 'id="card-phase"' "$work/tiny.html" | grep -q '>Succeeded<' &&
    grep -A1 'id="card-steps"' "$work/tiny.html" | grep -q '>200 / 200<' &&
    grep -A1 'id="card-restarts"' "$work/tiny.html" | grep -q '>0<' &&
    grep -q '<td>200</td><td>complete</td>' "$work/tiny.html" &&
    grep -q '<td>Succeeded</td><td>True</td>' "$work/tiny.html" ||
    { echo "  $work/tiny.html lacks phase Succeeded, 200 / 200 steps, 0 restarts, the step-200 checkpoint" >&2; return 1; }
}
check "railyard report of the tiny run: Succeeded, 200 / 200 steps, 0 restarts, checkpoint 200" report_of_tiny
mport=$(grep -oE 'listen=[0-9.]+:[0-9]+' "$work/monitor.log" | head -1 | cut -d: -f2)
curl -fsS "http://127.0.0.1:$mport/metrics" >"$work/monitor.prom" || fail "monitor /metrics"
check "the monitor evaluated the job namespace with its own token: evaluations, no Kubernetes errors" bash -c "
  awk '/^railyard_monitor_evaluations_total/ {e += \$2} /^railyard_monitor_query_errors_total.*source=\"kube\"/ {k += \$2}
       END {exit !(e > 0 && k == 0)}' '$work/monitor.prom'"
check "the monitor logged no Forbidden" bash -c "! grep -qi forbidden '$work/monitor.log'"
kill "$mon_pid"
wait "$mon_pid" 2>/dev/null || true
mon_pid=""
kubectl delete tj tiny -n "$team" --wait=false >/dev/null

# --- 4. (on demand: RAILYARD_RBAC_NECESSITY=1, ctest e2e_install_rbac_necessity) no rule is superfluous -------------
# Each rule of the operator's namespace-scope RBAC removed in turn: the job flow above must then fail.
if [ "${RAILYARD_RBAC_NECESSITY:-0}" = 1 ]; then
  flow_fails() { ! job_flow "$@"; }
  endpoints_refused() {
    kubectl delete endpoints "$reln-rendezvous" -n "$ns" --ignore-not-found >/dev/null
    start_operator
    for _ in $(seq 100); do grep -q "leading: reconciling" "$work/operator.log" && break; sleep 0.2; done
    sleep 3
    local written=0
    endpoints_written 2>/dev/null && written=1
    stop_operator || true
    [ "$written" = 0 ] || { echo "  the Endpoints were written anyway" >&2; return 1; }
  }
  metrics_refused() {
    local code
    start_operator
    code=$(status_of -k -H "Authorization: Bearer $reader_token" "$(metrics_url)")
    stop_operator || true
    [ "$code" != 200 ] || { echo "  the metrics reader still got /metrics" >&2; return 1; }
  }
  rbac_only "$work/ns.yaml" >"$work/ns-rbac.json"
  i=0
  while read -r kind role n; do
    for ((r = 0; r < n; r++)); do
      i=$((i + 1))
      what=$(jq -r --arg k "$kind" --arg n "$role" --argjson r "$r" 'select(.kind == $k and .metadata.name == $n) |
        .rules[$r] | "\(.resources | join(",")) [\(.verbs | join(","))]"' "$work/ns-rbac.json")
      # RAILYARD_RBAC_NECESSITY_ONLY=REGEX: only the rules whose resources and verbs match (when debugging one).
      if [ -n "${RAILYARD_RBAC_NECESSITY_ONLY:-}" ] && ! grep -qE "$RAILYARD_RBAC_NECESSITY_ONLY" <<<"$what"; then continue; fi
      jq -c --arg k "$kind" --arg n "$role" --argjson r "$r" 'select(.kind == $k and .metadata.name == $n) |
        .rules |= del(.[$r])' "$work/ns-rbac.json" | kubectl apply -f - >/dev/null
      # Every run a first start: the operator must create its rendezvous CA (or the create rule would look unneeded).
      kubectl delete secret "$reln-rendezvous-ca" -n "$ns" --ignore-not-found >/dev/null
      case "$what" in
        tokenreviews* | subjectaccessreviews*)
          # Jobs do not need these: without either, the metrics reader is refused (the review cannot be made).
          check "without $kind $role rule '$what' the metrics reader gets no /metrics" metrics_refused ;;
        endpoints*)
          # The jobs here dial the leader directly: without it the leader cannot point the rendezvous Service at itself.
          check "without $kind $role rule '$what' the leader cannot write the rendezvous Endpoints" endpoints_refused ;;
        pods/binding*)
          # Used only to bind pods that exist unbound (created before their gang fit); this flow creates each pod on
          # its node. Not removed here (docs/install.md).
          echo "  (not removed: '$what' is not on this flow's path)" ;;
        *) check "without $kind $role rule '$what' the job flow fails" flow_fails "necessity-$i" 25 ;;
      esac
      rbac_only "$work/ns.yaml" | kubectl apply -f - >/dev/null # restore
      kubectl delete tj "necessity-$i" -n "$team" --wait=false >/dev/null 2>&1 || true
    done
  done < <(jq -r 'select(.kind == "Role" or .kind == "ClusterRole") | select(.metadata.name | startswith("'"$opn"'")) |
    "\(.kind) \(.metadata.name) \(.rules | length)"' "$work/ns-rbac.json")
  check "the RBAC without changes still runs the flow" job_flow necessity-restored 60
fi
finish
