#!/usr/bin/env bash
# e2e_install_metric_names: every metric name the Grafana dashboards (deploy/grafana) and the Prometheus rules
# (deploy/prometheus/rules) query must be one the real binaries expose. Runs railyard-operator and railyard-monitor
# against the local cluster, railyard-worker training the tiny model with checkpoints, and a railyard-worker agent,
# scrapes their /metrics, and compares. Recording-rule names must be recorded by the rules file; `up` is Prometheus's.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
: "${KUBECONFIG:?KUBECONFIG must point at the local cluster}"
ns=railyard-install-metrics
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  kubectl delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for l in "$work"/*.log; do [ -f "$l" ] && { echo "--- $l (tail)" >&2; tail -5 "$l" >&2; }; done
  exit 1
}
for b in railyard-operator railyard-monitor railyard-worker railyard; do
  [ -x "$bin/$b" ] || fail "$bin/$b is not built (cmake --build <dir> --target $b)"
done
install_crd "$src" || fail "installing the CRD"
fresh_namespace "$ns"

# The operator watches an empty namespace (no other test's jobs), without leader election.
"$bin/railyard-operator" --namespace "$ns" --leader-elect=false --metrics-addr 127.0.0.1:0 --health-addr 127.0.0.1:0 \
  --rendezvous-bind 127.0.0.1:0 >"$work/operator.log" 2>&1 &
pids+=($!)
"$bin/railyard-monitor" --namespace "$ns" --listen 127.0.0.1:0 >"$work/monitor.log" 2>&1 &
pids+=($!)
# A worker training for real (long enough to be scraped), checkpointing every 2 steps.
"$bin/railyard" data prepare --input /usr/share/common-licenses/GPL-3 --output "$work/data" >/dev/null
wport=$(free_port)
"$bin/railyard-worker" train --model tiny --data "$work/data" --steps 100000 --batch 2 --seq 32 --threads 1 \
  --ckpt-dir "$work/ckpt" --ckpt-every 2 --metrics-port "$wport" --metrics-host 127.0.0.1 >"$work/worker.log" 2>&1 &
pids+=($!)
# An agent: it serves its metrics while it tries to reach a rendezvous service that is not there.
aport=$(free_port)
RAILYARD_JOB_NAMESPACE=$ns RAILYARD_JOB_NAME=metrics RAILYARD_POD_NAME=metrics-worker-0 RAILYARD_POD_IP=127.0.0.1 \
  RAILYARD_RENDEZVOUS_ADDR=127.0.0.1:$(free_port) RAILYARD_RENDEZVOUS_TOKEN=x RAILYARD_AGENT_METRICS_PORT=$aport \
  RAILYARD_AGENT_DIR="$work/agent" "$bin/railyard-worker" agent >"$work/agent.log" 2>&1 &
pids+=($!)

wait_for 20 "the operator's metrics address" grep -q 'metrics=127.0.0.1:[0-9]' "$work/operator.log"
oport=$(grep -o 'metrics=127.0.0.1:[0-9]*' "$work/operator.log" | head -1 | cut -d: -f2)
wait_for 20 "the monitor's address" grep -qE 'listen=[0-9.]+:[0-9]+' "$work/monitor.log"
mport=$(grep -oE 'listen=[0-9.]+:[0-9]+' "$work/monitor.log" | head -1 | cut -d: -f2)
scrape() { curl -fsS "http://127.0.0.1:$1/metrics" >"$work/$2.prom"; }
wait_for 20 "operator /metrics" scrape "$oport" operator
wait_for 20 "monitor /metrics" scrape "$mport" monitor
wait_for 20 "agent /metrics" scrape "$aport" agent
# The checkpoint gauges appear at the first commit: wait for a checkpoint, then scrape.
wait_for 60 "the worker's first checkpoint" bash -c "curl -fsS http://127.0.0.1:$wport/metrics |
  grep -q '^railyard_checkpoint_last_timestamp_seconds'"
scrape "$wport" worker
for c in operator monitor agent worker; do
  check "$c /metrics passes promtool check metrics" bash -c "promtool check metrics <'$work/$c.prom'"
done

# Exposed names: every family, with the series names Prometheus makes of histograms and summaries.
cat "$work"/*.prom | awk '$1 == "#" && $2 == "TYPE" {print $3, $4}' | sort -u >"$work/families"
awk '{print $1} $2 == "histogram" {print $1 "_bucket"; print $1 "_sum"; print $1 "_count"}
     $2 == "summary" {print $1 "_sum"; print $1 "_count"}' "$work/families" | sort -u >"$work/exposed"
echo up >>"$work/exposed"
objects "$src/deploy/prometheus/rules/railyard.rules.yml" | jq -r '.groups[].rules[] | .record // empty' |
  sort -u >"$work/recorded"
check "the binaries expose operator, controller-runtime, monitor, worker, checkpoint and agent families" bash -c "
  for p in railyard_operator_ controller_runtime_ workqueue_ railyard_monitor_ railyard_worker_ railyard_checkpoint_ \
      railyard_agent_; do grep -q \"^\$p\" '$work/exposed' || { echo \"  nothing named \$p*\" >&2; exit 1; }; done"

# Used names: identifiers in the PromQL of dashboards (panels, annotations, variables) and rules, with string
# literals removed, that look like metric names (our prefixes, `up`) or recording rules (contain a colon).
used_in() { # FILE KIND
  if [ "$2" = dashboard ]; then
    jq -r '(.panels[].targets[].expr), (.annotations.list[].expr // empty), (.templating.list[].definition // empty)' "$1"
  else
    objects "$1" | jq -r '.groups[].rules[].expr'
  fi | sed -E 's/"[^"]*"//g' | grep -oE '[a-zA-Z_:][a-zA-Z0-9_:]*' |
    grep -E '^(railyard_|workqueue_|controller_runtime_|up$)|:' | sort -u
}
for f in "$src"/deploy/grafana/*.json "$src"/deploy/prometheus/rules/railyard.rules.yml; do
  kind=rules
  [[ $f == *.json ]] && kind=dashboard
  used_in "$f" "$kind" >"$work/used"
  [ -s "$work/used" ] || fail "$f: no metric names found (is the extraction broken?)"
  unknown=$(comm -23 "$work/used" <(sort -u "$work/exposed" "$work/recorded") | xargs)
  check "$(basename "$f"): all $(wc -l <"$work/used") metric names are exposed or recorded${unknown:+ (unknown: $unknown)}" \
    test -z "$unknown"
done
cleanup
trap - EXIT
finish
