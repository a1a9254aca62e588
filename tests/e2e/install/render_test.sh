#!/usr/bin/env bash
# install_chart_render: the Helm chart rendered offline by minihelm for the default and three other value sets, checked
# against the intent of each value; wrong values refused naming the value; the chart's copies of the CRD, rules and
# dashboards byte-identical to deploy/; `kubectl kustomize deploy/` equal to the default render; the PrometheusRule
# content accepted by promtool; the dashboards' JSON checked against Grafana's dashboard model. No cluster needed.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

# --- copies -------------------------------------------------------------------------------------------------------
same_files() { # DIR_A DIR_B GLOB: the same file names, byte-identical
  local a=$1 b=$2 g=$3
  [ "$(cd "$a" && ls $g)" = "$(cd "$b" && ls $g)" ] || { echo "  $a and $b hold different $g files" >&2; return 1; }
  for f in $(cd "$a" && ls $g); do cmp "$a/$f" "$b/$f" || { echo "  copy it: cp $a/$f $b/$f" >&2; return 1; }; done
}
check "charts/railyard/files/crds is a byte-identical copy of deploy/crds" \
  same_files "$src/deploy/crds" "$chart/files/crds" '*.yaml'
# Helm installs crds/ once and never upgrades it; the CRD lives in templates/crds.yaml instead (crds.enabled).
check "the chart has no crds/ folder (Helm would install it beside the template's CRD and never upgrade it)" \
  test ! -e "$chart/crds"
check "chart dashboards are byte-identical copies of deploy/grafana" \
  same_files "$src/deploy/grafana" "$chart/files/dashboards" '*.json'
check "chart rules are a byte-identical copy of deploy/prometheus/rules/railyard.rules.yml" \
  cmp "$src/deploy/prometheus/rules/railyard.rules.yml" "$chart/files/railyard.rules.yml"

# A plain scalar in a YAML flow mapping ends at a comma: `{description: a, b}` makes "b" a schema keyword, which the
# API server refuses ("unknown field") once kustomize turns it into a string.
crd_stray_keys() {
  local bad
  bad=$(objects "$src/deploy/crds/trainingjobs.railyard.dev.yaml" |
    jq -r '[paths | select(.[-1] | type == "string" and test(" ")) | map(tostring) | join(".")] | .[]')
  [ -z "$bad" ] && return 0
  echo "  stray keys (quote the description in deploy/crds/trainingjobs.railyard.dev.yaml, then copy it to" \
    "charts/railyard/files/crds/):" >&2
  sed 's/^/    /' <<<"$bad" >&2
  return 1
}
check "deploy/crds: no schema key made of a description split at a comma" crd_stray_keys

# --- default values -------------------------------------------------------------------------------------------------
render "$work/default.yaml" --include-crds || fail "the default values do not render"
objects "$work/default.yaml" >"$work/default.json"
q() { jq -e -s "$1" "$2" >/dev/null; }
check "default: CRD, 2 Deployments, 3 Services, PDB, ClusterRoles (operator, monitor, metrics reader, users edit and view), operator and monitor Lease, rendezvous CA and rendezvous Endpoints Roles, 2 dashboards" q '
  (map(.kind) | sort) == (["ClusterRole","ClusterRole","ClusterRole","ClusterRole","ClusterRole","ClusterRoleBinding","ClusterRoleBinding","ConfigMap",
    "ConfigMap","CustomResourceDefinition","Deployment","Deployment","NetworkPolicy","NetworkPolicy","PodDisruptionBudget","Role","Role",
    "Role","Role","RoleBinding","RoleBinding","RoleBinding","RoleBinding","Service","Service","Service","ServiceAccount","ServiceAccount"])' "$work/default.json"
# The CRD from the template is deploy/crds' own, kept on uninstall; crds.keep=false drops the annotation and
# crds.enabled=false the CRD.
crd_of() { jq -S -s '[.[] | select(.kind == "CustomResourceDefinition")]' "$1"; }
check "default: the CRD is deploy/crds/trainingjobs.railyard.dev.yaml, with helm.sh/resource-policy keep" q '
  [.[] | select(.kind == "CustomResourceDefinition")] | length == 1 and
    .[0].metadata.annotations == {"helm.sh/resource-policy": "keep"}' "$work/default.json"
check "default: the rendered CRD equals deploy/crds' but for the keep annotation" cmp \
  <(crd_of "$work/default.json" | jq -S '.[0] | del(.metadata.annotations)') \
  <(objects "$src/deploy/crds/trainingjobs.railyard.dev.yaml" | jq -S .)
render "$work/crds-nokeep.yaml" --set crds.keep=false || fail "crds.keep=false does not render"
check "crds.keep=false: the CRD without annotations" q \
  '[.[] | select(.kind == "CustomResourceDefinition")] | length == 1 and (.[0].metadata | has("annotations") | not)' \
  <(objects "$work/crds-nokeep.yaml")
render "$work/crds-off.yaml" --set crds.enabled=false || fail "crds.enabled=false does not render"
check "crds.enabled=false: no CRD, everything else as by default" q \
  '([.[] | select(.kind == "CustomResourceDefinition")] | length == 0) and length == 27' <(objects "$work/crds-off.yaml")
check "crds.enabled must be a boolean (values.schema.json)" bash -c \
  "! \"\$0\" template \"\$1\" --name railyard --namespace railyard-system --set-string crds.enabled=yes >/dev/null 2>&1" \
  "$minihelm" "$chart"
# operator.metricsSecure (default true): HTTPS /metrics behind TokenReview + SubjectAccessReview, the rights to ask
# both, a ClusterRole for readers; false: none of it.
check "default: --metrics-secure, tokenreviews/subjectaccessreviews create, ClusterRole railyard-metrics-reader (get /metrics)" q '
  ([.[] | select(.kind == "Deployment" and .metadata.name == "railyard-operator")][0].spec.template.spec.containers[0].args
    | index("--metrics-secure=true") != null)
  and ([.[] | select(.kind == "ClusterRole" and .metadata.name == "railyard-operator") | .rules[]
    | select(.resources == ["tokenreviews"] or .resources == ["subjectaccessreviews"]) | [.apiGroups[0], .verbs]]
    == [["authentication.k8s.io", ["create"]], ["authorization.k8s.io", ["create"]]])
  and ([.[] | select(.kind == "ClusterRole" and .metadata.name == "railyard-metrics-reader") | .rules]
    == [[{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]])' "$work/default.json"
render "$work/plainmetrics.yaml" --set operator.metricsSecure=false || fail "operator.metricsSecure=false does not render"
check "operator.metricsSecure=false: no --metrics-secure, no review rights, no metrics-reader ClusterRole" q '
  ([.[] | select(.kind == "Deployment") | .spec.template.spec.containers[0].args[]] | index("--metrics-secure=true") == null)
  and ([.[] | select(.kind == "ClusterRole") | .rules[] | .resources // [] | .[]] | index("tokenreviews") == null)
  and ([.[] | select(.metadata.name == "railyard-metrics-reader")] | length == 0)' <(objects "$work/plainmetrics.yaml")
check "default: the monitor runs 2 replicas with leader election on the Lease railyard-monitor, spread over nodes" q '
  [.[] | select(.kind == "Deployment" and .metadata.name == "railyard-monitor")][0].spec as $d |
  $d.replicas == 2 and ($d | has("strategy") | not) and
  ($d.template.spec.containers[0].args | index("--leader-elect=true") != null and
    index("--leader-election-id=railyard-monitor") != null and index("--leader-election-namespace=railyard-system") != null) and
  ($d.template.spec.topologySpreadConstraints[0].topologyKey == "kubernetes.io/hostname")' "$work/default.json"
render "$work/mon1.yaml" --set monitor.leaderElection.enabled=false --set monitor.replicas=1 ||
  fail "monitor.leaderElection.enabled=false with 1 replica does not render"
check "monitor.leaderElection.enabled=false: 1 replica, Recreate, no --leader-elect, no monitor Lease Role" q '
  ([.[] | select(.kind == "Deployment" and .metadata.name == "railyard-monitor")][0].spec |
    .replicas == 1 and .strategy.type == "Recreate" and (.template.spec.containers[0].args | index("--leader-elect=true") == null))
  and ([.[] | select(.kind == "Role" and .metadata.name == "railyard-monitor-leader-election")] | length == 0)' \
  <(objects "$work/mon1.yaml")
check "default: the rendezvous Service has no selector and the leader writes its Endpoints (--leader-endpoints, POD_IP)" q '
  ([.[] | select(.kind == "Service" and .metadata.name == "railyard-rendezvous")][0].spec | has("selector") | not) and
  ([.[] | select(.kind == "Deployment" and .metadata.name == "railyard-operator")][0].spec.template.spec.containers[0] |
    (.args | index("--leader-endpoints=railyard-rendezvous") != null) and
    ([.env[] | select(.name == "POD_IP") | .valueFrom.fieldRef.fieldPath] == ["status.podIP"])) and
  ([.[] | select(.kind == "Role" and .metadata.name == "railyard-operator-rendezvous-endpoints")][0].rules ==
    [{"apiGroups": [""], "resources": ["endpoints"], "resourceNames": ["railyard-rendezvous"], "verbs": ["get", "update"]},
     {"apiGroups": [""], "resources": ["endpoints"], "verbs": ["create"]}])' "$work/default.json"
check "default: NetworkPolicies let in only the ports the operator and the monitor serve (issue #40 item 6)" q '
  [.[] | select(.kind == "NetworkPolicy")] | map({(.metadata.name): [.spec.ingress[].ports[].port]}) | add ==
  {"railyard-operator": ["rendezvous","metrics","health"], "railyard-monitor": ["metrics"]}' "$work/default.json"
check "default: every Deployment is non-root, read-only, drops ALL, RuntimeDefault seccomp, has requests and probes" q '
  [.[] | select(.kind == "Deployment") | .spec.template.spec as $p | $p.containers[] |
    ($p.securityContext.runAsNonRoot == true and $p.securityContext.seccompProfile.type == "RuntimeDefault"
     and .securityContext.readOnlyRootFilesystem == true and .securityContext.allowPrivilegeEscalation == false
     and .securityContext.capabilities.drop == ["ALL"] and (.resources.requests | has("cpu") and has("memory"))
     and .livenessProbe.httpGet.path != null and .readinessProbe.httpGet.path != null
     and ([.ports[].name] | index("metrics") != null))] | length == 2 and all' "$work/default.json"
check "default: operator probes /healthz and /readyz on its health port, leader election on, rendezvous on 9090" q '
  [.[] | select(.kind == "Deployment" and .metadata.name == "railyard-operator") | .spec.template.spec.containers[0]] |
  .[0] as $c | $c.livenessProbe.httpGet.path == "/healthz" and $c.readinessProbe.httpGet.path == "/readyz"
  and ($c.args | index("--leader-elect=true") != null) and ($c.args | index("--rendezvous-bind=0.0.0.0:9090") != null)
  and ($c.args | index("--rendezvous-addr=railyard-rendezvous.railyard-system.svc:9090") != null)
  and $c.image == "railyard/operator:0.1.0" and ($c.args | index("--worker-image=railyard/worker:0.1.0") != null)' \
  "$work/default.json"
check "default: operator replicas spread over nodes by their own selector labels; no PriorityClass unless asked" q '
  [.[] | select(.kind == "Deployment") | {(.metadata.name): .spec}] | add as $d
  | $d["railyard-operator"].template.spec.topologySpreadConstraints == [{"maxSkew": 1,
      "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
      "labelSelector": {"matchLabels": $d["railyard-operator"].selector.matchLabels}}]
  and ([$d[].template.spec | has("priorityClassName")] == [false, false])' "$work/default.json"
render "$work/prio.yaml" --set operator.priorityClassName=system-cluster-critical --set monitor.priorityClassName=ops-high \
  --set operator.spreadAcrossNodes=false --set monitor.spreadAcrossNodes=false || fail "priorityClassName values do not render"
check "priorityClassName on both Deployments; spreadAcrossNodes false drops the constraint" q '
  [.[] | select(.kind == "Deployment") | .spec.template.spec | [.priorityClassName, has("topologySpreadConstraints")]]
  | sort == [["ops-high", false], ["system-cluster-critical", false]]' <(objects "$work/prio.yaml")
check "default: worker pods serve rank metrics on 9400+ and the agent's on 9399 (--agent-metrics-port)" q '
  [.[] | select(.kind == "Deployment" and .metadata.name == "railyard-operator") | .spec.template.spec.containers[0]
    .args] | .[0] | index("--worker-metrics-port=9400") != null and index("--agent-metrics-port=9399") != null' \
  "$work/default.json"
check "default: rendezvous TLS auto, its CA in railyard-system/railyard-rendezvous-ca, readable by name only" q '
  ([.[] | select(.kind == "Deployment" and .metadata.name == "railyard-operator") | .spec.template.spec.containers[0]
    .args] | .[0] | index("--rendezvous-tls=auto") != null
    and index("--rendezvous-ca-secret=railyard-system/railyard-rendezvous-ca") != null)
  and ([.[] | select(.kind == "Role" and .metadata.name == "railyard-operator-rendezvous-ca") | .rules]
    == [[{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["railyard-rendezvous-ca"], "verbs": ["get"]},
         {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}]])
  and (map(select(.kind == "Certificate")) | length == 0)' "$work/default.json"
render "$work/cm.yaml" --set rendezvous.tls.mode=certManager --set rendezvous.tls.certManager.issuerRef.name=ca-issuer ||
  fail "rendezvous.tls.mode=certManager does not render"
check "rendezvous.tls.mode=certManager: a Certificate for the Service name, mounted, served with --rendezvous-tls files" q '
  ([.[] | select(.kind == "Certificate")] | length == 1 and .[0].spec.secretName == "railyard-rendezvous-tls"
    and .[0].spec.dnsNames == ["railyard-rendezvous.railyard-system.svc",
                               "railyard-rendezvous.railyard-system.svc.cluster.local"]
    and .[0].spec.issuerRef == {"name": "ca-issuer", "kind": "Issuer", "group": "cert-manager.io"})
  and ([.[] | select(.kind == "Deployment" and .metadata.name == "railyard-operator") | .spec.template.spec] | .[0] as $p
    | ($p.containers[0].args | index("--rendezvous-tls=files") != null
       and index("--rendezvous-tls-dir=/etc/railyard/rendezvous-tls") != null)
    and $p.volumes == [{"name": "rendezvous-tls", "secret": {"secretName": "railyard-rendezvous-tls"}}]
    and $p.containers[0].volumeMounts[0].mountPath == "/etc/railyard/rendezvous-tls")
  and (map(select(.kind == "Role" and .metadata.name == "railyard-operator-rendezvous-ca")) | length == 0)' \
  <(objects "$work/cm.yaml")
render "$work/tlsoff.yaml" --set rendezvous.tls.mode=off || fail "rendezvous.tls.mode=off does not render"
check "rendezvous.tls.mode=off: plain HTTP, no CA Role" q '
  ([.[] | select(.kind == "Deployment" and .metadata.name == "railyard-operator") | .spec.template.spec.containers[0]
    .args] | .[0] | index("--rendezvous-tls=off") != null)
  and (map(select(.kind == "Role" and .metadata.name == "railyard-operator-rendezvous-ca")) | length == 0)' \
  <(objects "$work/tlsoff.yaml")
render "$work/noagent.yaml" --set worker.agentMetricsPort=0 || fail "worker.agentMetricsPort=0 does not render"
check "worker.agentMetricsPort=0 turns the agent metrics off" q '
  [.[] | select(.kind == "Deployment" and .metadata.name == "railyard-operator") | .spec.template.spec.containers[0]
    .args] | .[0] | index("--agent-metrics-port=0") != null' <(objects "$work/noagent.yaml")
check "default: no path roots (--data-root/--checkpoint-root absent)" q '
  [.[] | select(.kind == "Deployment" and .metadata.name == "railyard-operator") | .spec.template.spec.containers[0]
    .args] | .[0] | map(select(startswith("--data-root") or startswith("--checkpoint-root"))) == []' "$work/default.json"
render "$work/roots.yaml" --set worker.dataRoot=/data --set worker.checkpointRoot=/ckpt ||
  fail "worker.dataRoot/checkpointRoot do not render"
check "worker.dataRoot/checkpointRoot become --data-root/--checkpoint-root" q '
  [.[] | select(.kind == "Deployment" and .metadata.name == "railyard-operator") | .spec.template.spec.containers[0]
    .args] | .[0] | index("--data-root=/data") != null and index("--checkpoint-root=/ckpt") != null' \
  <(objects "$work/roots.yaml")
check "worker.dataRoot must be absolute" bash -c '! "$0" template "$1" --name r --namespace n --set worker.dataRoot=data \
  >/dev/null 2>&1' "$minihelm" "$chart"
check "default: the operator ClusterRole has no wildcard, no secrets list/watch, no nodes write" q '
  [.[] | select(.kind == "ClusterRole" and .metadata.name == "railyard-operator") | .rules[]] as $r |
  ($r | map(.verbs[], .resources[], .apiGroups[]) | index("*") == null)
  and ([$r[] | select(.resources | index("secrets")) | .verbs[]] | (index("list") == null and index("watch") == null))
  and ([$r[] | select(.resources | index("nodes")) | .verbs] == [["get","list","watch"]])' "$work/default.json"
# Children carry blockOwnerDeletion: true; with OwnerReferencesPermissionEnforcement that needs update on the owner's
# finalizers (granted exactly: no other verb, and not to the monitor).
finalizers_rule() { # FILE KIND NAME: the role's rules on trainingjobs/finalizers are exactly one, update
  q "[.[] | select(.kind == \"$2\" and .metadata.name == \"$3\") | .rules[] | select(.resources | index(\"trainingjobs/finalizers\"))
    | {apiGroups, resources, verbs}] == [{apiGroups: [\"railyard.dev\"], resources: [\"trainingjobs/finalizers\"], verbs: [\"update\"]}]" "$1"
}
check "default: the operator ClusterRole may update trainingjobs/finalizers (blockOwnerDeletion), nothing more on it" \
  finalizers_rule "$work/default.json" ClusterRole railyard-operator
check "default: the monitor has no rule on trainingjobs/finalizers" q '
  [.[] | select(.metadata.name == "railyard-monitor") | .rules[]? | .resources[]] | index("trainingjobs/finalizers") == null' \
  "$work/default.json"
check "default: PodDisruptionBudget minAvailable 1 selects the operator pods" q '
  [.[] | select(.kind == "PodDisruptionBudget")][0] as $p | [.[] | select(.kind == "Deployment" and
  .metadata.name == "railyard-operator")][0] as $d | $p.spec.minAvailable == 1
  and $p.spec.selector.matchLabels == $d.spec.selector.matchLabels' "$work/default.json"
check "default: no prometheus-operator objects without monitoring.coreos.com/v1" q \
  'map(select(.apiVersion == "monitoring.coreos.com/v1")) | length == 0' "$work/default.json"
check "default: dashboards ConfigMaps labelled grafana_dashboard=1 hold valid JSON" q '
  [.[] | select(.kind == "ConfigMap")] | length == 2 and all(.metadata.labels.grafana_dashboard == "1"
  and (.data | to_entries[0].value | fromjson | .uid != null))' "$work/default.json"
"$minihelm" template "$chart" --notes >"$work/notes.txt" || fail "NOTES.txt does not render"
check "default: NOTES.txt names the namespace and the next steps" grep -q "kubectl get tj -w" "$work/notes.txt"

# --- the plain manifests agree with the chart ----------------------------------------------------------------------
kubectl kustomize "$src/deploy" >"$work/kustomize.yaml" || fail "kubectl kustomize deploy/ failed"
canonical "$work/default.yaml" >"$work/chart.canon"
canonical "$work/kustomize.yaml" >"$work/kustomize.canon"
check "kubectl kustomize deploy/ equals the chart's default render (modulo Helm's labels)" \
  diff <(jq -c '[.kind, .metadata.name]' "$work/chart.canon") <(jq -c '[.kind, .metadata.name]' "$work/kustomize.canon")
check "... object by object" cmp -s "$work/chart.canon" "$work/kustomize.canon"
check "kustomize: the Namespace railyard-system with restricted Pod Security" q \
  'map(select(.kind == "Namespace" and .metadata.name == "railyard-system" and
   .metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted")) | length == 1' \
  <(objects "$work/kustomize.yaml")
# The API server of the local cluster (v1.20) has no PodSecurity admission: tests/e2e/lib/pod_security.py applies the
# restricted profile's rules to every pod template instead (the worker pods: operator_unit_tests; live pods on real
# kubelets: e2e_real_nodes, e2e_real_install, e2e_real_program).
check "restricted Pod Security: the chart's pod templates (operator, monitor)" \
  python3 "$src/tests/e2e/lib/pod_security.py" "$work/default.json"
check "restricted Pod Security: the kustomize pod templates" \
  bash -c 'python3 "$0/tests/e2e/lib/pod_security.py" <("$1" yaml2json "$2")' "$src" "$minihelm" "$work/kustomize.yaml"

check "default: users' roles: railyard-edit aggregates into edit and admin, railyard-view into view, TrainingJobs only" q '
  ([.[] | select(.kind == "ClusterRole" and .metadata.name == "railyard-edit")][0]) as $e
  | ([.[] | select(.kind == "ClusterRole" and .metadata.name == "railyard-view")][0]) as $v
  | $e.metadata.labels["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
  and $e.metadata.labels["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
  and $v.metadata.labels["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
  and ([$e.rules[], $v.rules[]] | map(.apiGroups == ["railyard.dev"]) | all)
  and ($v.rules | map(.verbs) | flatten | unique) == ["get","list","watch"]' "$work/default.json"
render "$work/nouser.yaml" --set rbac.userRoles=false || fail "rbac.userRoles=false does not render"
check "rbac.userRoles=false: no users' roles" bash -c "! grep -Eq 'name: railyard-(edit|view)$' '$work/nouser.yaml'"

# --- non-default value sets ----------------------------------------------------------------------------------------
render "$work/ns.yaml" -f "$values_dir/namespace-scope.yaml" || fail "namespace-scope.yaml does not render"
objects "$work/ns.yaml" >"$work/ns.json"
check "namespace scope: operator and monitor Roles in team-a, cluster-wide only reading nodes, priorityclasses, storageclasses, pods" q '
  ([.[] | select(.kind == "Role" and .metadata.namespace == "team-a") | .metadata.name] | sort)
    == ["railyard-monitor","railyard-operator"]
  and ([.[] | select(.kind == "ClusterRole" and (.metadata.name | test("-(edit|view|metrics-reader)$") | not)) | .rules[]
    | [.resources, .verbs]] == [[["nodes"], ["get","list","watch"]], [["priorityclasses"], ["list","watch"]],
      [["storageclasses"], ["get"]], [["tokenreviews"], ["create"]], [["subjectaccessreviews"], ["create"]], [["pods"], ["list","watch"]]])' \
  "$work/ns.json"
check "namespace scope: the operator Role in team-a may update trainingjobs/finalizers (blockOwnerDeletion)" \
  finalizers_rule "$work/ns.json" Role railyard-operator
check "namespace scope: operator and monitor watch team-a; monitor queries Prometheus, needs no pods rule" q '
  ([.[] | select(.kind == "Deployment") | .spec.template.spec.containers[0].args | index("--namespace=team-a")]
    | all(. != null))
  and ([.[] | select(.kind == "Deployment" and .metadata.name == "railyard-monitor") | .spec.template.spec.containers[0]
    .args[]] | index("--prometheus-url=http://prometheus-operated.monitoring.svc:9090") != null)
  and ([.[] | select(.kind == "Role" and .metadata.name == "railyard-monitor") | .rules[].resources[]]
    | index("pods") == null)' "$work/ns.json"
check "namespace scope: webhook token mounted from the Secret, worker SA without token, 1 replica so no PDB" q '
  ([.[] | select(.kind == "Deployment" and .metadata.name == "railyard-monitor") | .spec.template.spec |
    .volumes[0].secret.secretName == "railyard-webhook" and
    (.containers[0].args | index("--webhook-token-file=/etc/railyard/webhook/token") != null)] == [true])
  and ([.[] | select(.kind == "ServiceAccount" and .metadata.name == "railyard-worker") |
    [.metadata.namespace, .automountServiceAccountToken]] == [["team-a", false]])
  and (map(select(.kind == "PodDisruptionBudget")) | length == 0)' "$work/ns.json"
check "namespace scope: PodMonitor requested but not rendered without monitoring.coreos.com/v1" q \
  'map(select(.kind == "PodMonitor")) | length == 0' "$work/ns.json"

render "$work/nomon.yaml" -f "$values_dir/no-monitor.yaml" || fail "no-monitor.yaml does not render"
objects "$work/nomon.yaml" >"$work/nomon.json"
check "no monitor: no monitor objects, no dashboards; 3 operator replicas from the private registry" q '
  (map(select(.metadata.name | test("monitor|dashboard"))) | length == 0)
  and ([.[] | select(.kind == "Deployment")] | length == 1 and .[0].spec.replicas == 3 and
    .[0].spec.template.spec.containers[0].image == "registry.example.com:5000/ml/railyard-operator:1.2.3" and
    .[0].spec.template.spec.imagePullSecrets == [{"name": "regcred"}] and
    (.[0].spec.template.spec.containers[0].args | index("--lease-duration=30") != null and
     index("--worker-image=registry.example.com:5000/ml/railyard-worker:1.2.3") != null and
     index("--rendezvous-bind=0.0.0.0:29400") != null))
  and ([.[] | select(.kind == "Service" and .metadata.name == "railyard-rendezvous") | .spec.ports[0].port] == [29400])'\
  "$work/nomon.json"

render "$work/po.yaml" -f "$values_dir/prometheus-operator.yaml" --api-versions monitoring.coreos.com/v1 \
  --set prometheus.prometheusRule.runbookBaseUrl=https://git.example.internal/ml/railyard/docs/runbook.md ||
  fail "prometheus-operator.yaml does not render"
objects "$work/po.yaml" >"$work/po.json"
check "prometheus-operator: ServiceMonitor, PodMonitor, PrometheusRule with the release label; dashboards in monitoring" q '
  ([.[] | select(.apiVersion == "monitoring.coreos.com/v1") | [.kind, .metadata.labels.release]] | sort)
    == [["PodMonitor","kube-prometheus-stack"],["PrometheusRule","kube-prometheus-stack"],
        ["ServiceMonitor","kube-prometheus-stack"],["ServiceMonitor","kube-prometheus-stack"]]
  and ([.[] | select(.kind == "ConfigMap") | .metadata.namespace] == ["monitoring","monitoring"])
  and ([.[] | select(.kind == "PodMonitor") | .spec.podMetricsEndpoints[0].honorLabels] == [false])
  and ([.[] | select(.kind == "PodMonitor") | .spec.podMetricsEndpoints[0] | [has("port"), .relabelings[1]]]
    == [[false, {"sourceLabels": ["__meta_kubernetes_pod_container_port_name"], "regex": "metrics(-[0-9]+)?",
                 "action": "keep"}]])
  and ([.[] | select(.kind == "PodMonitor") | .spec.podMetricsEndpoints[1] | [.port, .honorLabels]]
    == [["agent-metrics", false]])
  and ([.[] | select(.kind == "ServiceMonitor") | .spec.endpoints[0] | [.port, .honorLabels]]
    == [["metrics", true], ["metrics", true]])
  and ([.[] | select(.kind == "ServiceMonitor") | .spec.namespaceSelector.matchNames]
    == [["railyard-system"], ["railyard-system"]])
  and ([.[] | select(.kind == "ServiceMonitor") | [.spec.selector.matchExpressions[1].values[0], .spec.endpoints[0].scheme,
      .spec.endpoints[0].bearerTokenFile, .spec.endpoints[0].tlsConfig.insecureSkipVerify]]
    == [["railyard-operator", "https", "/var/run/secrets/kubernetes.io/serviceaccount/token", true],
        ["railyard-monitor", null, null, null]])' \
  "$work/po.json"
# Metrics cannot be spoofed across jobs (docs/monitor.md "Who may speak for a job"): on both worker endpoints the
# job, pod and node come from the pod's metadata, and no target label hides the process's rank or generation.
check "prometheus-operator: the PodMonitor's identity labels come from pod metadata" q '
  [.[] | select(.kind == "PodMonitor") | .spec.podMetricsEndpoints[]
    | [.relabelings[] | select(.targetLabel and .targetLabel != "__address__") | {(.targetLabel): .sourceLabels}] | add
    == {"namespace": ["__meta_kubernetes_namespace"], "trainingjob": ["__meta_kubernetes_pod_label_railyard_dev_job"],
        "pod": ["__meta_kubernetes_pod_name"], "node": ["__meta_kubernetes_pod_node_name"]}]
  == [true, true]' "$work/po.json"
jq -s '.[] | select(.kind == "PrometheusRule") | .spec' "$work/po.json" >"$work/prometheusrule.json"
check "prometheus-operator: promtool check rules accepts the PrometheusRule content" \
  promtool check rules --lint-fatal "$work/prometheusrule.json"
check "prometheus-operator: every alert's runbook_url is runbookBaseUrl#<alert>" q '
  [.[] | select(.kind == "PrometheusRule") | .spec.groups[].rules[] | select(.alert)
    | .annotations.runbook_url == "https://git.example.internal/ml/railyard/docs/runbook.md#" + (.alert | ascii_downcase)]
  | length >= 6 and all' "$work/po.json"
check "prometheus-operator: the PrometheusRule has every rule of deploy/prometheus/rules" \
  test "$(jq '[.groups[].rules[]] | length' "$work/prometheusrule.json")" = \
  "$(objects "$src/deploy/prometheus/rules/railyard.rules.yml" | jq '[.groups[].rules[]] | length')"

# --- wrong values fail, naming the value ---------------------------------------------------------------------------
refuses() { # MESSAGE-REGEX minihelm-args...: rendering fails with exit 1 and a message matching the regex
  local want=$1 rc=0
  shift
  "$minihelm" template "$chart" "$@" >/dev/null 2>"$work/err" || rc=$?
  [ "$rc" -eq 1 ] && grep -Eq -- "$want" "$work/err" || { echo "  rc=$rc: $(cat "$work/err")" >&2; return 1; }
}
check "negative replica count" refuses '^- operator\.replicas: Must be greater than or equal to 1' --set operator.replicas=-1
check "missing operator image" refuses '^- operator\.image\.repository: String length must be' \
  --set operator.image.repository=
check "removed operator image" refuses '^- operator\.image: repository is required' --set operator.image.repository=null
check "certManager without an issuer" refuses 'rendezvous\.tls\.certManager\.issuerRef\.name: name the cert-manager' \
  --set rendezvous.tls.mode=certManager
check "unknown rendezvous TLS mode" refuses '^- rendezvous\.tls\.mode: .*"auto", "certManager", "off"' \
  --set rendezvous.tls.mode=on
check "a PriorityClass name that is not a DNS subdomain" refuses '^- operator\.priorityClassName: Does not match pattern' \
  --set operator.priorityClassName=Not_A_Name
check "unknown RBAC scope" refuses '^- rbac\.scope: .*"cluster", "namespace"' --set rbac.scope=everything
check "misspelt value" refuses 'operator: Additional property replica is not allowed' --set operator.replica=2
check "two replicas without leader election" refuses '^- operator\.replicas: Must be less than or equal to 1' \
  --set operator.leaderElection.enabled=false
check "two monitor replicas without leader election" refuses '^- monitor\.replicas: Must be less than or equal to 1' \
  --set monitor.leaderElection.enabled=false
check "agent metrics port out of range" refuses '^- worker\.agentMetricsPort: Must be less than or equal to 65535' \
  --set worker.agentMetricsPort=70000
check "rendezvous port out of range" refuses '^- rendezvous\.port: Must be less than or equal to 65535' \
  --set rendezvous.port=70000
check "replicas as a string" refuses '^- operator\.replicas: Invalid type' --set-string operator.replicas=two
check "bad Prometheus URL" refuses '^- monitor\.prometheusUrl: Does not match pattern' \
  --set monitor.prometheusUrl=prometheus:9090
printf 'operator:\n  replicas: [\n' >"$work/notyaml.yaml"
check "a values file that is not YAML names the file" refuses 'notyaml\.yaml' -f "$work/notyaml.yaml"

jqe() { jq -e "$@" >/dev/null; }
# --- dashboards: Grafana's dashboard model -------------------------------------------------------------------------
for d in "$src"/deploy/grafana/*.json; do
  name=$(basename "$d")
  check "$name: uid, title, schemaVersion, datasource variable, editable JSON" jqe '
    (.uid | type == "string" and test("^[a-z0-9-]{1,40}$")) and (.title | length > 0) and .schemaVersion >= 36
    and ([.templating.list[] | select(.type == "datasource" and .query == "prometheus" and .name == "datasource")]
      | length == 1) and (.panels | length > 0)' "$d"
  check "$name: panels have unique ids, a type, a grid position, the datasource variable, targets and a unit" jqe '
    ([.panels[].id] | length == (unique | length)) and all(.panels[];
      (.type | IN("timeseries", "stat", "heatmap", "gauge", "bargauge", "table", "text"))
      and (.gridPos | .x >= 0 and .y >= 0 and .w > 0 and .h > 0 and .x + .w <= 24)
      and .datasource.uid == "${datasource}" and (.title | length > 0)
      and (.fieldConfig.defaults.unit | type == "string" and length > 0)
      and (.targets | length > 0 and all(.expr | length > 0) and ([.[].refId] | length == (unique | length))))' "$d"
  check "$name: panels do not overlap" jqe '
    [.panels[] | .gridPos as $g | range($g.y; $g.y + $g.h) as $y | range($g.x; $g.x + $g.w) as $x | "\($x),\($y)"]
    | length == (unique | length)' "$d"
  check "$name: every query variable uses the datasource variable" jqe \
    'all(.templating.list[] | select(.type == "query"); .datasource.uid == "${datasource}")' "$d"
done
check "dashboard uids are distinct" test "$(jq -r .uid "$src"/deploy/grafana/*.json | sort -u | wc -l)" = \
  "$(ls "$src"/deploy/grafana/*.json | wc -l)"
check "training dashboard: namespace and job variables, restart annotations" jqe '
  ([.templating.list[].name] | index("namespace") != null and index("job") != null)
  and ([.annotations.list[] | select(.expr != null) | .expr] | any(test("railyard_operator_restarts_total")))' \
  "$src/deploy/grafana/railyard-training-job.json"
finish
