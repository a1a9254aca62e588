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
grep -q "SUCCESS: 16 rules found" <<<"$out" || fail "unexpected rule count: $out"
out=$(cd "$dir/rules" && promtool test rules railyard.test.yml 2>&1) || fail "test rules: $out"
# Goodput (docs/observability.md): a restarted job's recomputed steps count once, a stalled job reads 0.
out=$(cd "$dir/rules" && promtool test rules goodput.test.yml 2>&1) || fail "test rules (goodput): $out"

# The rule tests must be able to fail: a wrong expectation is reported.
sed 's/summary: "rank 1 of ns\/j on node n1 is unreachable"/summary: "wrong"/' "$dir/rules/railyard.test.yml" \
  >"$tmp/broken.test.yml"
cp "$dir/rules/railyard.rules.yml" "$tmp/"
if (cd "$tmp" && promtool test rules broken.test.yml >/dev/null 2>&1); then fail "a wrong expectation passed"; fi

# Local template, rendered the way deploy/local/lib/prometheus.sh renders it.
mkdir -p "$tmp/targets" "$tmp/rules"
cp "$dir/rules/railyard.rules.yml" "$tmp/rules/"
echo '[{"targets":["127.0.0.1:9"],"labels":{"namespace":"n","job":"j","rank":"0"}}]' >"$tmp/targets/t.json"
sed -e "s|@TARGETS_DIR@|$tmp/targets|g" -e "s|@RULES_DIR@|$tmp/rules|g" "$dir/prometheus-local.yml" >"$tmp/local.yml"
out=$(promtool check config "$tmp/local.yml" 2>&1) || fail "check config (local): $out"

# Debian's Prometheus is built without the Kubernetes discovery plugin, so promtool cannot parse
# kubernetes_sd_configs. Swap each for an equivalent static list and check everything else (relabelling, rules).
mkdir -p "$tmp/k8s/rules"
cp "$dir/rules/railyard.rules.yml" "$tmp/k8s/rules/"
sed -e 's/^    kubernetes_sd_configs:$/    static_configs:/' -e "s/^      - role: pod$/      - targets: ['127.0.0.1:9']/" \
  "$dir/prometheus.yml" >"$tmp/k8s/prometheus.yml"
grep -q kubernetes_sd_configs "$tmp/k8s/prometheus.yml" && fail "kubernetes_sd_configs left after substitution"
out=$(promtool check config "$tmp/k8s/prometheus.yml" 2>&1) || fail "check config (cluster): $out"
echo "promtool: rules, rule tests and both configs OK"
