#!/usr/bin/env bash
# e2e_install_observability: the dashboards (deploy/grafana) and the rules (deploy/prometheus/rules) against the real
# binaries. Runs railyard-operator and railyard-monitor against the local cluster, a TrainingJob whose pod fails twice
# (two PodFailed restarts: the injected failure) and then gets a firing alert through the monitor's Alertmanager
# webhook (a third restart), railyard-worker training the tiny model with checkpoints and validation under that job's
# labels, and a railyard-worker agent; then
#  1. every metric name the dashboards' and rules' PromQL uses is exposed by one of them (scraped /metrics, each passing
#     promtool check metrics) or recorded by the rules file (`up` is Prometheus's own);
#  2. a real Prometheus scrapes them with the rules loaded, and every dashboard query (panels, annotations) and every
#     recording rule returns data for that job, every alert expression evaluates, and the template variables find the
#     job's namespace and name.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
: "${KUBECONFIG:?KUBECONFIG must point at the local cluster}"
ns=railyard-install-metrics
job=observed
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  [ -d "$work/prom" ] && bash "$src/deploy/local/lib/prometheus.sh" down "$work/prom" >/dev/null 2>&1
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
# Embedded mode; the job's shell pods serve no metrics, so the unreachable rule is pushed out of the test's time.
RAILYARD_MONITOR_WEBHOOK_TOKEN=observe-token "$bin/railyard-monitor" --namespace "$ns" --listen 127.0.0.1:0 \
  --unreachable 600 >"$work/monitor.log" 2>&1 &
pids+=($!)
# A worker training for real under the job's labels (long enough to be scraped), checkpointing every 2 steps and
# validating every 5.
"$bin/railyard" data prepare --input /usr/share/common-licenses/GPL-3 --output "$work/data" >/dev/null
wport=$(free_port)
RAILYARD_JOB_NAMESPACE=$ns RAILYARD_JOB_NAME=$job RAILYARD_GENERATION=1 RAILYARD_NODE_NAME=local \
  "$bin/railyard-worker" train --model tiny --data "$work/data" --steps 100000 --batch 2 --seq 32 --threads 1 \
  --val-every 5 --val-steps 2 --ckpt-dir "$work/ckpt" --ckpt-every 2 --metrics-port "$wport" \
  --metrics-host 127.0.0.1 >"$work/worker.log" 2>&1 &
pids+=($!)
# An agent: it serves its metrics while it tries to reach a rendezvous service that is not there.
aport=$(free_port)
RAILYARD_JOB_NAMESPACE=$ns RAILYARD_JOB_NAME=$job RAILYARD_POD_NAME=$job-worker-0 RAILYARD_POD_IP=127.0.0.1 \
  RAILYARD_NODE_NAME=local RAILYARD_RENDEZVOUS_ADDR=127.0.0.1:$(free_port) RAILYARD_RENDEZVOUS_TOKEN=x \
  RAILYARD_AGENT_METRICS_PORT=$aport RAILYARD_AGENT_DIR="$work/agent" "$bin/railyard-worker" agent \
  >"$work/agent.log" 2>&1 &
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
# (a histogram's or summary's own name is not a series: querying it finds nothing)
awk '$2 == "histogram" {print $1 "_bucket"; print $1 "_sum"; print $1 "_count"; next}
     $2 == "summary" {print $1; print $1 "_sum"; print $1 "_count"; next} {print $1}' "$work/families" |
  sort -u >"$work/exposed"
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

# --- 2. Prometheus over the same processes --------------------------------------------------------------------------
bash "$src/deploy/local/lib/prometheus.sh" up "$work/prom" >"$work/prometheus-up.log" 2>&1 ||
  fail "starting Prometheus: $(tail -3 "$work/prometheus-up.log")"
prom=$(sed -n 's/^export PROMETHEUS_URL=//p' "$work/prom/prometheus/prometheus.env")
[ -n "$prom" ] || fail "no PROMETHEUS_URL in $work/prom/prometheus/prometheus.env"
bash "$src/deploy/local/lib/prometheus.sh" write-targets "$work/prom" railyard "[
  {\"targets\": [\"127.0.0.1:$oport\", \"127.0.0.1:$mport\"], \"labels\": {\"job\": \"railyard\"}},
  {\"targets\": [\"127.0.0.1:$aport\"],
   \"labels\": {\"namespace\": \"$ns\", \"trainingjob\": \"$job\", \"pod\": \"$job-worker-0\", \"node\": \"local\"}},
  {\"targets\": [\"127.0.0.1:$wport\"],
   \"labels\": {\"namespace\": \"$ns\", \"trainingjob\": \"$job\", \"pod\": \"$job-worker-0\", \"node\": \"local\"}}]" ||
  fail "writing the Prometheus targets"
# The injected failure, once the operator is scraped: the job's pod exits 137 (a signal: retryable) twice, so that
# the restart counter goes 1 -> 2 inside Prometheus (a counter's first sample counts as no increase).
wait_for 30 "Prometheus to scrape the operator" bash -c "curl -fsS '$prom/api/v1/query' \
  --data-urlencode 'query=up{instance=\"127.0.0.1:$oport\"} == 1' | jq -e '.data.result | length == 1'"
[ "$(kubectl get nodes -o name | wc -l)" -ge 1 ] || fail "the cluster has no nodes (start it with the node agent)"
cat <<YAML | kubectl apply -n "$ns" -f - >/dev/null
apiVersion: railyard.dev/v1alpha1
kind: TrainingJob
metadata: {name: $job}
spec:
  replicas: 1
  device: cpu
  model: {preset: tiny}
  data: {train: /tmp/none/train_*.bin}
  training: {steps: 10, globalBatch: 12, microBatch: 1}
  failurePolicy: {maxRestarts: 5}
  template:
    spec:
      containers:
        - command: ["sh", "-c", "n=\$(cat $work/runs 2>/dev/null || echo 0); echo \$((n+1)) >$work/runs;
            if [ \$n -lt 2 ]; then sleep 1.5; exit 137; fi; sleep 600"]
YAML
restarts() {
  curl -fsS "$prom/api/v1/query" --data-urlencode \
    "query=sum(railyard_operator_restarts_total{namespace=\"$ns\", trainingjob=\"$job\"})" | jq -r '.data.result[0].value[1]'
}
wait_for 60 "two restarts of the job in Prometheus" bash -c "[ \"\$(curl -fsS '$prom/api/v1/query' --data-urlencode \
  'query=sum(railyard_operator_restarts_total{namespace=\"$ns\", trainingjob=\"$job\"})' | jq -r '.data.result[0].value[1]')\" = 2 ]"
check "the job restarted twice (status and Prometheus agree)" \
  test "$(kubectl get tj "$job" -n "$ns" -o jsonpath='{.status.restarts}'):$(restarts)" = 2:2

# A second failure path, Alertmanager -> monitor -> operator: a firing alert for the job through the monitor's webhook
# (refused without the token first) becomes a verdict (rule alertmanager), a restart request, and a third restart.
webhook() { # TOKEN: prints the HTTP code
  curl -s -o "$work/webhook.out" -w '%{http_code}' -X POST -H 'Content-Type: application/json' \
    ${1:+-H "Authorization: Bearer $1"} "http://127.0.0.1:$mport/webhook/alertmanager" -d '{"version": "4",
    "status": "firing", "receiver": "railyard", "groupKey": "{}", "alerts": [{"status": "firing",
    "labels": {"alertname": "RailyardJobStalled", "namespace": "'"$ns"'", "trainingjob": "'"$job"'"},
    "annotations": {"summary": "injected by e2e_install_observability"}}]}'
}
check "the monitor's webhook refuses a call without the token (401)" test "$(webhook "")" = 401
check "the monitor's webhook accepts the alert" test "$(webhook observe-token):$(jq -r .accepted "$work/webhook.out")" = 200:1
wait_for 60 "the third restart (RestartRequested) in Prometheus" bash -c "[ \"\$(curl -fsS '$prom/api/v1/query' \
  --data-urlencode 'query=sum(railyard_operator_restarts_total{namespace=\"$ns\", trainingjob=\"$job\"})' |
  jq -r '.data.result[0].value[1]')\" = 3 ]"
check "the third restart's reason is RestartRequested, detector monitor" test \
  "$(kubectl get tj "$job" -n "$ns" -o jsonpath='{.status.lastRestart.reason}/{.status.lastRestart.detector}')" = \
  RestartRequested/monitor

# query EXPR: prints the number of series the query returns over the last 5 minutes, as Grafana asks for a panel or
# an annotation (a range query); fails on a PromQL error.
query() {
  local now
  now=$(date +%s)
  curl -sS "$prom/api/v1/query_range" --data-urlencode "query=$1" --data-urlencode "start=$((now - 300))" \
    --data-urlencode "end=$now" --data-urlencode "step=2" |
    jq -e -r 'if .status == "success" then (.data.result | length) else error(.error) end'
}
evaluates() { query "$1" >/dev/null; }
returns_data() { # EXPR: non-empty within 30 s (rates need two samples; the rules run every second)
  local t0=$SECONDS n
  while :; do
    n=$(query "$1" 2>"$work/query.err") || { echo "  PromQL error: $1: $(cat "$work/query.err")" >&2; return 1; }
    [ "$n" -gt 0 ] && return 0
    [ $((SECONDS - t0)) -lt 30 ] || { echo "  no data: $1" >&2; return 1; }
    sleep 1
  done
}
# Grafana's variables and macros as a user viewing this job would have them.
grafana_expand() { sed -e "s/\\\$namespace/$ns/g; s/\\\$job/$job/g; s/\\\$rank/0/g; s/\\\$__rate_interval/1m/g; s/\\\$__range/5m/g"; }
for d in "$src"/deploy/grafana/*.json; do
  while IFS=$'\t' read -r title expr; do
    # The operator's time to detect and to recover need a monitor-detected failure and a real trainer's first step
    # after the restart; this job's pods run a shell command. e2e_monitor_restart_loop checks those panels.
    if grep -qE 'railyard_operator_(detection|recovery)_seconds' <<<"$expr"; then
      echo "skip: $(basename "$d" .json) / $title (checked by e2e_monitor_restart_loop)"
      continue
    fi
    check "$(basename "$d" .json) / $title: returns data" returns_data "$(grafana_expand <<<"$expr")"
  done < <(jq -r '(.panels[] | .title as $t | .targets[] | [$t, .expr]), (.annotations.list[] | select(.expr) |
    ["annotation " + .name, .expr]) | map(gsub("\n"; " ")) | @tsv' "$d")
  for v in $(jq -r '.templating.list[] | select(.type == "query") | .name' "$d"); do
    def=$(jq -r --arg v "$v" '.templating.list[] | select(.name == $v) | .definition' "$d" | grafana_expand)
    # label_values(SELECTOR, LABEL) -> /api/v1/label/LABEL/values?match[]=SELECTOR
    label=$(sed -E 's/^label_values\((.*), *([a-z_]+)\)$/\2/' <<<"$def")
    sel=$(sed -E 's/^label_values\((.*), *([a-z_]+)\)$/\1/' <<<"$def")
    want=$(case $v in namespace) echo "$ns" ;; job) echo "$job" ;; *) echo 0 ;; esac)
    check "$(basename "$d" .json) / variable $v finds $want" bash -c "curl -fsS '$prom/api/v1/label/$label/values' \
      --data-urlencode 'match[]=$sel' -G | jq -e --arg w '$want' '.data | index(\$w) != null' >/dev/null"
  done
done
rules=$(objects "$src/deploy/prometheus/rules/railyard.rules.yml")
for r in $(jq -r '.groups[].rules[] | .record // empty' <<<"$rules"); do
  check "recording rule $r returns data for the job" returns_data "$r{namespace=\"$ns\", trainingjob=\"$job\"}"
done
# The worker trains steadily under the job's labels, so its goodput is above 0 (low: the 5-minute window reaches back
# before the worker's first step) and at most 1.
goodput_positive() {
  curl -fsS "$prom/api/v1/query" --data-urlencode "query=railyard:job_goodput:ratio5m{namespace=\"$ns\", trainingjob=\"$job\"}" |
    jq -e '.data.result[0].value[1] | tonumber | . > 0 and . <= 1' >/dev/null
}
check "goodput of the training worker is in (0, 1]" goodput_positive
# An alert's expression returns data only while it fires. So that its inputs are shown to return data for the job
# (names, labels, vector matching), each comparison outside label matchers becomes a `bool` comparison (every compared
# series, 0 or 1) and `offset` is dropped (RailyardLossSpike compares with the loss 2 minutes ago, longer than this run).
as_inputs() {
  python3 -c '
import re, sys
e, out, depth, quote = sys.argv[1], "", 0, None
i = 0
while i < len(e):
    c = e[i]
    if quote:
        out += c; quote = None if c == quote else quote; i += 1; continue
    if c in "\"\x27": quote = c
    elif c == "{": depth += 1
    elif c == "}": depth -= 1
    m = re.match(r"(==|!=|>=|<=|>|<)(\s*bool\b)?", e[i:]) if depth == 0 and not quote else None
    if m:
        out += m.group(1) + " bool"; i += m.end(); continue
    out += c; i += 1
print(re.sub(r"\s+offset\s+\d+[smhdwy]", "", out))' "$1"
}
while IFS=$'\t' read -r a expr; do
  check "alert $a: its expression evaluates" evaluates "$expr"
  inputs=$(as_inputs "$expr")
  check "alert $a: its inputs return data for the job ($inputs)" returns_data "$inputs"
done < <(jq -r '.groups[].rules[] | select(.alert) | [.alert, (.expr | gsub("\n"; " "))] | @tsv' <<<"$rules")
check "Prometheus loaded the rules without errors" bash -c "curl -fsS '$prom/api/v1/rules' |
  jq -e '[.data.groups[].rules[] | select(.health != \"ok\")] | length == 0' >/dev/null"
# The report without Grafana, from the same Prometheus: its loss, tokens/s, step-time and MFU lines have points.
prom_report() {
  "$bin/railyard" report "$ns/$job" --prometheus "$prom" --since 10m --output "$work/prom.html" >/dev/null || return 1
  local n
  for id in chart-loss chart-tokens chart-step-time chart-mfu; do
    n=$(sed -n "/id=\"$id\"/,/<\/svg>/p" "$work/prom.html" | grep -o 'path fill="none"[^>]*d="[^"]*"' | grep -o 'L' |
      wc -l)
    [ "$n" -ge 3 ] || { echo "  $id: $n line segments from Prometheus" >&2; return 1; }
  done
  grep -A1 'id="card-steps"' "$work/prom.html" | grep -Eq '>[1-9][0-9]* / 100000<' ||
    { echo "  steps card: $(grep -A1 'id="card-steps"' "$work/prom.html" | tail -1)" >&2; return 1; }
}
check "railyard report $ns/$job --prometheus: loss, tokens/s, step time, MFU drawn; steps N / 100000" prom_report
no_series() {
  local rc=0
  "$bin/railyard" report "$ns/nosuchjob" --prometheus "$prom" --output "$work/none.html" >/dev/null \
    2>"$work/none.err" || rc=$?
  [ "$rc" = 1 ] && grep -q "no railyard_worker_step for namespace=\"$ns\", trainingjob=\"nosuchjob\"" "$work/none.err" ||
    { echo "  rc=$rc: $(cat "$work/none.err")" >&2; return 1; }
}
check "railyard report --prometheus: a job without series is refused, naming it" no_series
kubectl delete tj "$job" -n "$ns" --wait=false >/dev/null
cleanup
trap - EXIT
finish
