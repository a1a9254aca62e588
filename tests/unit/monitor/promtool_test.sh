#!/usr/bin/env bash
# promtool on deploy/prometheus: rule syntax, rule unit tests (input series -> expected alerts), both configs.
set -euo pipefail
src=${RAILYARD_SOURCE_DIR:?}
dir="$src/deploy/prometheus"
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v promtool >/dev/null || fail "promtool not installed (apt-get install prometheus)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

out=$(promtool check rules --lint-fatal "$dir/rules/railyard.rules.yml" 2>&1) || fail "check rules: $out"
grep -q "SUCCESS: 20 rules found" <<<"$out" || fail "unexpected rule count: $out"
out=$(cd "$dir/rules" && promtool test rules railyard.test.yml 2>&1) || fail "test rules: $out"
# Goodput (docs/observability.md): a restarted job's recomputed steps count once, a stalled job reads 0.
out=$(cd "$dir/rules" && promtool test rules goodput.test.yml 2>&1) || fail "test rules (goodput): $out"

# The rule tests must be able to fail: a wrong expectation is reported.
sed 's/summary: "pod j-worker-1 of ns\/j on node n1 is unreachable (10.0.0.2:9400)"/summary: "wrong"/' \
  "$dir/rules/railyard.test.yml" >"$tmp/broken.test.yml"
grep -q 'summary: "wrong"' "$tmp/broken.test.yml" || fail "the broken expectation was not written (sed pattern stale)"
cp "$dir/rules/railyard.rules.yml" "$tmp/"
if (cd "$tmp" && promtool test rules broken.test.yml >/dev/null 2>&1); then fail "a wrong expectation passed"; fi
# ... and the pause test needs the pause: without the `unless` on railyard_worker_paused, job v's validation pass
# fires the stall alert.
sed 's/unless on (namespace, trainingjob) max by (namespace, trainingjob) (railyard_worker_paused) > 0//' \
  "$dir/rules/railyard.rules.yml" >"$tmp/railyard.rules.yml"
cp "$dir/rules/railyard.test.yml" "$tmp/"
grep -q "(railyard_worker_paused) > 0" "$tmp/railyard.rules.yml" && fail "the pause exception was not removed (sed pattern stale)"
out=$(cd "$tmp" && promtool test rules railyard.test.yml 2>&1) && fail "the stall alert ignores the pause series"
grep -q 'trainingjob="v"' <<<"$out" || fail "without the pause exception, job v did not fire: $out"

# Every alert that requests a restart (railyard_action: restart) has a `for:`, CheckpointTooOld requests none, and
# every alert's runbook_url names a section of docs/runbook.md (a heading whose anchor is the alert's name).
python3 - "$dir/rules/railyard.rules.yml" "$src/docs/runbook.md" <<'PY' || fail "alert conventions (above)"
import re, sys, yaml
rules = [r for g in yaml.safe_load(open(sys.argv[1]))["groups"] for r in g["rules"] if "alert" in r]
anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
           for h in re.findall(r"^#+ (.*)$", open(sys.argv[2]).read(), re.M)}
bad = []
for r in rules:
    a, restart = r["alert"], r.get("labels", {}).get("railyard_action") == "restart"
    if restart and not r.get("for"): bad.append(a + ": requests a restart without a `for:`")
    if a == "RailyardCheckpointTooOld" and restart: bad.append(a + ": must warn, not restart")
    url = r.get("annotations", {}).get("runbook_url", "")
    if not url.endswith("#" + a.lower()) or a.lower() not in anchors:
        bad.append(a + ": runbook_url '" + url + "' does not name docs/runbook.md's section '### " + a + "'")
if len(rules) < 6: bad.append("only %d alerts found" % len(rules))
print("\n".join(bad), file=sys.stderr)
sys.exit(1 if bad else 0)
PY

# Local template, rendered the way deploy/local/lib/prometheus.sh renders it.
mkdir -p "$tmp/targets" "$tmp/rules"
cp "$dir/rules/railyard.rules.yml" "$tmp/rules/"
echo '[{"targets":["127.0.0.1:9"],"labels":{"namespace":"n","trainingjob":"j","pod":"j-worker-0","node":"x"}}]' >"$tmp/targets/t.json"
sed -e "s|@TARGETS_DIR@|$tmp/targets|g" -e "s|@RULES_DIR@|$tmp/rules|g" "$dir/prometheus-local.yml" >"$tmp/local.yml"
out=$(promtool check config "$tmp/local.yml" 2>&1) || fail "check config (local): $out"

# Debian's Prometheus is built without the Kubernetes discovery plugin, so promtool cannot parse
# kubernetes_sd_configs. Swap each for an equivalent static list and check everything else (relabelling, rules).
mkdir -p "$tmp/k8s/rules"
cp "$dir/rules/railyard.rules.yml" "$tmp/k8s/rules/"
# promtool also wants the ServiceAccount token file a pod would have: a stand-in.
echo stand-in >"$tmp/k8s/token"
sed -e 's/^    kubernetes_sd_configs:$/    static_configs:/' -e "s/^      - role: pod$/      - targets: ['127.0.0.1:9']/" \
  -e '/^        namespaces:$/d' -e '/^          names: \[.*\]$/d' \
  -e "s|/var/run/secrets/kubernetes.io/serviceaccount/token|$tmp/k8s/token|" \
  "$dir/prometheus.yml" >"$tmp/k8s/prometheus.yml"
grep -q kubernetes_sd_configs "$tmp/k8s/prometheus.yml" && fail "kubernetes_sd_configs left after substitution"
out=$(promtool check config "$tmp/k8s/prometheus.yml" 2>&1) || fail "check config (cluster): $out"

# Metrics cannot be spoofed across jobs (docs/monitor.md "Who may speak for a job"): every scrape job of pods that
# tenants create takes the identity labels from the target (the pod's metadata) with honor_labels false; the one
# job that honours served labels (the operator's) looks only at the operator's namespace.
cat >"$tmp/identity.py" <<'PY'
import sys, yaml
bad = []
for path in sys.argv[1:]:
    for job in yaml.safe_load(open(path))["scrape_configs"]:
        name, relabel = job["job_name"], job.get("relabel_configs", [])
        honor = job.get("honor_labels", False)
        targets = {r.get("target_label"): r.get("source_labels") for r in relabel if r.get("target_label")}
        if name in ("railyard-workers", "railyard-agents"):
            if honor: bad.append(f"{path} {name}: honor_labels must be false")
            if "kubernetes_sd_configs" in job:
                want = {"namespace": ["__meta_kubernetes_namespace"],
                        "trainingjob": ["__meta_kubernetes_pod_label_railyard_dev_job"],
                        "pod": ["__meta_kubernetes_pod_name"], "node": ["__meta_kubernetes_pod_node_name"]}
                for label, src in want.items():
                    if targets.get(label) != src: bad.append(f"{path} {name}: {label} must come from {src}")
                # Every local rank is a target: pod discovery's one target per container port, kept by name, the
                # address left as discovered (podIP:port).
                if name == "railyard-workers":
                    ports = [r for r in relabel if r.get("source_labels") == ["__meta_kubernetes_pod_container_port_name"]]
                    if [(r.get("regex"), r.get("action")) for r in ports] != [("metrics(-[0-9]+)?", "keep")]:
                        bad.append(f"{path} {name}: must keep each rank's port (metrics, metrics-N) by name")
                    if "__address__" in targets:
                        bad.append(f"{path} {name}: __address__ rewritten: the ranks' targets collapse into one")
            else:
                keep = [r for r in relabel if r.get("action") == "keep"]
                if not any(r.get("source_labels") == ["namespace", "trainingjob", "pod", "node"] for r in keep):
                    bad.append(f"{path} {name}: entries without namespace, trainingjob, pod and node must be dropped")
            for label in ("rank", "generation"):
                if label in targets: bad.append(f"{path} {name}: {label} is the process's; a target label hides it")
        elif honor:
            sd = job.get("kubernetes_sd_configs", [{}])[0]
            drops = any(r.get("source_labels") == ["trainingjob"] and r.get("action") == "drop" for r in relabel)
            if "kubernetes_sd_configs" in job and not sd.get("namespaces", {}).get("names"):
                bad.append(f"{path} {name}: honor_labels true over pods of every namespace")
            if "file_sd_configs" in job and not drops:
                bad.append(f"{path} {name}: honor_labels true must not scrape worker entries")
print("\n".join(bad), file=sys.stderr)
sys.exit(1 if bad else 0)
PY
python3 "$tmp/identity.py" "$dir/prometheus.yml" "$dir/prometheus-local.yml" || fail "identity labels (above)"
# And the check bites: honor_labels true on the workers' job, or the operator's job over every namespace, fail it.
sed 's/^    honor_labels: false$/    honor_labels: true/' "$dir/prometheus-local.yml" >"$tmp/honor.yml"
python3 "$tmp/identity.py" "$tmp/honor.yml" 2>/dev/null && fail "honor_labels true on the workers passed the check"
# ... and so does a workers' job that scrapes one port per pod.
sed 's/^        regex: metrics(-\[0-9\]+)?$/        regex: metrics/' "$dir/prometheus.yml" >"$tmp/onerank.yml"
grep -qF 'metrics(-[0-9]+)?' "$tmp/onerank.yml" && fail "the one-rank variant was not made"
python3 "$tmp/identity.py" "$tmp/onerank.yml" 2>/dev/null && fail "one port per pod passed the check"
sed -e '/^        namespaces:$/d' -e '/^          names: \[.*\]$/d' "$dir/prometheus.yml" >"$tmp/allns.yml"
python3 "$tmp/identity.py" "$tmp/allns.yml" 2>/dev/null && fail "the operator's job over every namespace passed the check"
echo "promtool: rules, rule tests, both configs and their identity labels OK"
