#!/usr/bin/env bash
# E2E: the whole restart loop of issue 7 with the real trainer and checkpoints on. The operator runs a TrainingJob
# (one pod: railyard-worker agent -> railyard-worker train, checkpoint every 20 steps); railyard-monitor scrapes the
# worker itself (embedded mode). The worker process is frozen (SIGSTOP) -> the monitor's stall rule annotates a
# restart request -> the operator opens generation 2 -> the agent replaces the worker, which restores the newest
# checkpoint (the step after the restart continues from it, not 0) -> the job Succeeds. Prints the time to detect
# and to recover. A real Prometheus scrapes the operator throughout; at the end the "Railyard / Operator" dashboard's
# time-to-detect and time-to-recover panels (deploy/grafana) return data from it.
set -euo pipefail
# shellcheck source=../lib/cluster_env.sh
source "${RAILYARD_SOURCE_DIR:?}/tests/e2e/lib/cluster_env.sh" ckpt-loop-e2e
job=loop
op_pid="" mon_pid="" frozen="" prom_dir=""
fail() {
  echo "FAIL: $*" >&2
  kubectl get tj,pods -n "$ns" -o wide >&2 || true
  kubectl get tj "$job" -n "$ns" -o jsonpath='{.status}' >&2 || true
  echo >&2
  echo "== operator" >&2 && tail -n 25 "$work/op.log" >&2
  echo "== monitor" >&2 && tail -n 15 "$work/mon.log" >&2
  for f in "$state"/node-agent/pods/"${ns}"_*/*.log; do [ -f "$f" ] && { echo "== $f" >&2; tail -n 25 "$f" >&2; }; done
  exit 1
}
cleanup() {
  [ -n "$frozen" ] && kill -CONT "$frozen" 2>/dev/null || true
  [ -n "$mon_pid" ] && kill "$mon_pid" 2>/dev/null && wait "$mon_pid" 2>/dev/null || true
  [ -n "$op_pid" ] && kill "$op_pid" 2>/dev/null && wait "$op_pid" 2>/dev/null || true
  [ -n "$prom_dir" ] && bash "$src/deploy/local/lib/prometheus.sh" down "$prom_dir" >/dev/null 2>&1 || true
  kubectl delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
# shellcheck source=../operator/lib.sh
source "$src/tests/e2e/operator/lib.sh"
jp() { kubectl get tj "$job" -n "$ns" -o jsonpath="$1" 2>/dev/null; }
now() { date +%s.%N; }

"$bin/railyard" data prepare --input /usr/share/common-licenses/* --output "$work/data" >/dev/null
install_crd "$src"
kubectl create namespace "$ns" >/dev/null
op_metrics=127.0.0.1:$(free_port)
"$bin/railyard-operator" --namespace "$ns" --leader-elect=false --worker-command "$bin/railyard-worker" \
  --metrics-addr "$op_metrics" --health-addr "127.0.0.1:$(free_port)" --rendezvous-bind 127.0.0.1:0 \
  >"$work/op.log" 2>&1 &
op_pid=$!
"$bin/railyard-monitor" --namespace "$ns" --listen 127.0.0.1:0 --interval 1 >"$work/mon.log" 2>&1 &
mon_pid=$!
# Prometheus scrapes the operator before the failure: the time-to-detect and time-to-recover histograms get their one
# observation while it watches.
prom_dir=$work/prom
bash "$src/deploy/local/lib/prometheus.sh" up "$prom_dir" >"$work/prometheus-up.log" 2>&1 ||
  fail "starting Prometheus: $(tail -3 "$work/prometheus-up.log")"
prom=$(sed -n 's/^export PROMETHEUS_URL=//p' "$prom_dir/prometheus/prometheus.env")
[ -n "$prom" ] || fail "no PROMETHEUS_URL in $prom_dir/prometheus/prometheus.env"
bash "$src/deploy/local/lib/prometheus.sh" write-targets "$prom_dir" railyard \
  "[{\"targets\": [\"$op_metrics\"], \"labels\": {\"job\": \"railyard\"}}]" || fail "writing the Prometheus targets"

ckpt=$work/ckpt
kubectl apply -n "$ns" -f - >/dev/null <<EOF
apiVersion: railyard.dev/v1alpha1
kind: TrainingJob
metadata:
  name: $job
spec:
  replicas: 1
  procsPerReplica: 1
  device: cpu
  model: {preset: tiny}
  data: {train: $work/data/train_*.bin}
  training: {steps: 600, globalBatch: 4, microBatch: 4, seqLen: 64, learningRate: 0.001, warmupSteps: 10}
  checkpoint: {path: $ckpt, intervalSteps: 20, keep: 3}
  failurePolicy: {maxRestarts: 2, hangTimeoutSeconds: 60, excludeFailedNodes: false}
  # The monitor's stall rule is under test: the agent's own hang watch (it finds a stopped trainer in about 1 s) is off.
  template:
    spec:
      containers:
      - env:
        - {name: RAILYARD_HANG_STOPPED_SECONDS, value: "0"}
        - {name: RAILYARD_HANG_STALL_SECONDS, value: "0"}
EOF

# Generation 1 trains and checkpoints.
# Read from the trainer's log, not status.step (which the operator refreshes every few seconds): on a quiet machine
# the tiny model runs a step in ~20 ms.
log=$state/node-agent/pods/${ns}_${job}-worker-0/worker.log
wait_for 120 "generation 1 at step >= 45 with a checkpoint" \
  bash -c "[ -f '$ckpt/latest' ] && s=\$(grep -o 'step=[0-9]*/600' '$log' | tail -1 | grep -o '=[0-9]*' | tr -d =) && [ \"\${s:-0}\" -ge 45 ]"
[ "$(jp '{.status.generation}')" = 1 ] || fail "generation is '$(jp '{.status.generation}')' before the freeze"

# Freeze the training process (the agent's child; the agent itself keeps running, as with a hung CUDA kernel).
agent_pid=$("$bin/railyard-node-agent" status --json --state-dir "$state/node-agent" |
  python3 -c "import json,sys; print(next(p['pid'] for p in json.load(sys.stdin)['pods'] if p['namespace']=='$ns'))")
worker_pid=$(cat /proc/"$agent_pid"/task/*/children | tr ' ' '\n' | grep -m1 .) || fail "no worker under agent $agent_pid"
grep -q "train" /proc/"$worker_pid"/cmdline || fail "pid $worker_pid is not the trainer"
kill -STOP "$worker_pid"
frozen=$worker_pid
t_freeze=$(now)
log=$(ls "$state"/node-agent/pods/"${ns}"_"${job}"-worker-0/*.log | head -1)
sleep 0.5
step_frozen=$(grep -o 'step=[0-9]*/600' "$log" | tail -1 | grep -o '=[0-9]*' | tr -d =)
echo "froze worker pid $worker_pid at step $step_frozen"

# Detection: the monitor's restart request.
wait_for 40 "the monitor's restart request" bash -c "kubectl get tj $job -n $ns -o json | python3 -c \
  'import json,sys; a=json.load(sys.stdin)[\"metadata\"].get(\"annotations\",{}); sys.exit(0 if \"railyard.dev/restart-request\" in a else 1)'"
t_detect=$(now)
req=$(kubectl get tj "$job" -n "$ns" -o json | python3 -c \
  'import json,sys; print(json.load(sys.stdin)["metadata"]["annotations"]["railyard.dev/restart-request"])')
echo "restart request: $req"
python3 - "$req" <<'PY' || fail "restart request is not a Hang from the monitor's stall rule: $req"
import json, sys
r = json.loads(sys.argv[1])
sys.exit(0 if r["reason"] == "Hang" and r["rule"] == "stall" and r["detector"] == "monitor" and r["generation"] == 1 else 1)
PY
# The frozen worker is the agent's to stop (SIGTERM stays pending while stopped, then SIGKILL after the grace).
frozen=""

# Recovery: generation 2 restores the newest checkpoint and trains on.
wait_for 90 "generation 2" bash -c "[ \"\$(kubectl get tj $job -n $ns -o jsonpath='{.status.generation}')\" = 2 ]"
wait_for 60 "the restored worker's first step" bash -c "grep -A400 'checkpoint: restored' '$log' | grep -q 'step=[0-9]*/600'"
t_recover=$(now)
restored=$(grep -o 'checkpoint: restored step=[0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
[ -n "$restored" ] || fail "the new worker did not restore a checkpoint"
first=$(grep -A400 'checkpoint: restored' "$log" | grep -o 'step=[0-9]*/600' | head -1 | grep -o '=[0-9]*' | tr -d =)
echo "generation 2 restored step $restored; its first step is $first (frozen at step $step_frozen)"
# The agent continues the stopped worker with its SIGTERM, so it normally saves the step it was on (no step lost);
# if that save misses the grace period, the newest periodic checkpoint (a multiple of 20) is restored instead.
gen1_last=$(sed -n '/checkpoint: restored/q;p' "$log" | grep -o 'step=[0-9]*/600' | tail -1 | grep -o '=[0-9]*' | tr -d =)
if [ "$restored" = "$gen1_last" ]; then
  echo "restored the step saved on SIGTERM: no step lost"
else
  [ "$restored" -ge 40 ] && [ $((restored % 20)) = 0 ] && [ "$restored" -le "$gen1_last" ] ||
    fail "restored step $restored is neither generation 1's last step $gen1_last nor a periodic checkpoint before it"
  echo "restored periodic checkpoint $restored (generation 1 reached $gen1_last)"
fi
[ "$first" = $((restored + 1)) ] || fail "first step after the restart is $first, want $((restored + 1))"
[ "$restored" -ge "$step_frozen" ] || [ $((restored % 20)) = 0 ] || fail "restored step $restored is before the frozen step $step_frozen"

wait_for 180 "Succeeded" bash -c "[ \"\$(kubectl get tj $job -n $ns -o jsonpath='{.status.phase}')\" = Succeeded ]"
[ "$(jp '{.status.progress}')" = "600/600" ] || fail "progress is '$(jp '{.status.progress}')'"
[ "$(jp '{.status.restarts}')" = 1 ] || fail "restarts: $(jp '{.status.restarts}')"
[ "$(jp '{.status.lastRestart.detector}')" = monitor ] || fail "lastRestart.detector: '$(jp '{.status.lastRestart.detector}')'"
# The operator records a monitor's request as RestartRequested with the request (reason Hang) in the message.
[ "$(jp '{.status.lastRestart.reason}')" = RestartRequested ] || fail "lastRestart.reason: '$(jp '{.status.lastRestart.reason}')'"
jp '{.status.lastRestart.message}' | grep -q '"reason":"Hang"' || fail "lastRestart.message: $(jp '{.status.lastRestart.message}')"
# The operator measures both times itself: detection from the request's onset, recovery to the first new step.
[ "$(jp '{.status.lastRestart.symptom}')" = Hang ] || fail "lastRestart.symptom: '$(jp '{.status.lastRestart.symptom}')'"
python3 - "$(jp '{.status.lastRestart}')" "$restored" "$first" <<'PY' || fail "lastRestart times: $(jp '{.status.lastRestart}')"
import json, sys
r, restored, first = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
ok = (r["generation"] == 2 and r["detectSeconds"] > 0 and 0 < r["recoverySeconds"] < 120
      and r["resumedStep"] >= first and r["stepAtRestart"] > 0)
sys.exit(0 if ok else 1)
PY
# Scraped until the series shows (about 5 s at most): the status above was written after the observation, so a scrape
# without it is the scrape's own failure (a scrape with no recovery series at all was seen once, 2026-12-07), not a missing one.
op_text=""
for _ in $(seq 1 10); do
  op_text=$(curl -s --max-time 5 "http://$op_metrics/metrics" || true)
  grep -q '^railyard_operator_recovery_seconds_count{reason="RestartRequested"}' <<<"$op_text" && break
  sleep 0.5
done
grep -q '^railyard_operator_recovery_seconds_count{reason="RestartRequested"} 1' <<<"$op_text" ||
  fail "railyard_operator_recovery_seconds has no RestartRequested observation: $(grep recovery_seconds_count <<<"$op_text")"
# The one observation is the recovery the status reports (status rounds to 0.1 s), not a time measured against the
# superseded generation's first step (which came out negative and was clamped to 0 before).
python3 - "$(jp '{.status.lastRestart.recoverySeconds}')" \
  "$(sed -n 's/^railyard_operator_recovery_seconds_sum{reason="RestartRequested"} //p' <<<"$op_text")" <<'PY' ||
import sys
status_s, hist_s = float(sys.argv[1]), float(sys.argv[2])
sys.exit(0 if status_s > 0 and abs(hist_s - status_s) <= 0.06 else 1)
PY
  fail "railyard_operator_recovery_seconds_sum != status.lastRestart.recoverySeconds: $(grep recovery_seconds_sum <<<"$op_text")"
grep -q '^railyard_operator_detection_seconds_count{symptom="Hang"} 1' <<<"$op_text" ||
  fail "railyard_operator_detection_seconds has no Hang observation: $(grep detection_seconds_count <<<"$op_text")"
# The goodput ledger (status.goodput, docs/observability.md "Where a job's time went"): stopped at Succeeded; its causes
# add up to its wall time, which is the job's life (creation to the Succeeded write); the hang's time from the last
# step to the restart decision is detection (about the monitor's detectSeconds, plus the request's way to the
# operator), two worlds' start-up is scheduling and rendezvousAndInit, the checkpoint restore the workers reported is
# restore, the rest trained; the operator's gauge says the same.
python3 - "$(kubectl get tj "$job" -n "$ns" -o json)" "$op_text" <<'PY' || fail "status.goodput: $(jp '{.status.goodput}')"
import json, sys, re
from datetime import datetime, timezone
tj, metrics = json.loads(sys.argv[1]), sys.argv[2]
g, last = tj["status"]["goodput"], tj["status"]["lastRestart"]
secs = g["seconds"]
def t(s): return datetime.strptime(s.replace("Z", "+00:00"), "%Y-%m-%dT%H:%M:%S.%f%z" if "." in s else "%Y-%m-%dT%H:%M:%S%z")
life = (t(g["since"]) - t(tj["metadata"]["creationTimestamp"])).total_seconds()
print("goodput ledger:", json.dumps(g))
problems = []
if g["state"] != "ended": problems.append("state %r after Succeeded" % g["state"])
if abs(sum(secs.values()) - g["wallSeconds"]) > 0.01: problems.append("causes sum to %.3f, wall %.3f" % (sum(secs.values()), g["wallSeconds"]))
if not (life - 0.1 <= g["wallSeconds"] <= life + 1.1): problems.append("wall %.3f, life %.3f" % (g["wallSeconds"], life))
if not (last["detectSeconds"] - 1.5 <= secs["detection"] <= last["detectSeconds"] + 10):
    problems.append("detection %.3f vs the monitor's detectSeconds %.1f" % (secs["detection"], last["detectSeconds"]))
# Generation 2 restored a checkpoint: its workers' restore time moved out of rendezvousAndInit.
for c in ("training", "scheduling", "rendezvousAndInit", "restore"):
    if secs[c] <= 0: problems.append(c + " is 0")
if g["workers"]["generation"] != 2 or g["charged"]["restore"] != g["workers"]["restore"]:
    problems.append("workers/charged: %r / %r" % (g["workers"], g["charged"]))
if not (0 < g["ratio"] < 1): problems.append("ratio %r" % g["ratio"])
for c, v in secs.items():
    m = re.search(r'^railyard_operator_job_seconds\{[^}]*cause="%s"[^}]*trainingjob="%s"[^}]*\} (\S+)$' % (c, tj["metadata"]["name"]), metrics, re.M)
    if not m or abs(float(m.group(1)) - v) > 0.01: problems.append("gauge for %s: %s, status %.3f" % (c, m and m.group(1), v))
for p in problems: print("  " + p, file=sys.stderr)
sys.exit(1 if problems else 0)
PY
detect=$(python3 -c "print(f'{$t_detect - $t_freeze:.1f}')")
recover=$(python3 -c "print(f'{$t_recover - $t_detect:.1f}')")
annotated=$(python3 -c "import json,sys; from datetime import datetime as d; r=json.loads(sys.argv[1]); f='%Y-%m-%dT%H:%M:%SZ'; \
print((d.strptime(r['time'],f)-d.strptime(r['onset'],f)).total_seconds())" "$req")
echo "times: freeze -> restart request ${detect} s (annotation time - onset ${annotated} s); request -> first step of generation 2 ${recover} s"
# What the operator records about them (see docs/monitor.md "The loop"): status and metrics.
echo "status.lastRestart: $(jp '{.status.lastRestart}')"
echo "operator metrics on restarts: $(curl -s "http://$op_metrics/metrics" | grep -E '^railyard_operator_(restart|time_to|detect|recover)' | tr '\n' ' ')"
# The operator dashboard's time-to-detect and time-to-recover panels, as the range queries Grafana sends for the last
# 5 minutes: each returns a finite value (the one Hang detection, the one RestartRequested recovery).
panel_data() { # EXPR
  local now
  now=$(date +%s)
  curl -fsS "$prom/api/v1/query_range" --data-urlencode "query=$1" --data-urlencode "start=$((now - 300))" \
    --data-urlencode "end=$now" --data-urlencode "step=2" |
    jq -e '.status == "success" and ([.data.result[].values[][1] | select(. != "NaN" and . != "+Inf")] | length > 0)' \
      >/dev/null
}
n=0
while IFS=$'\t' read -r title expr; do
  wait_for 30 "operator dashboard / $title: data for '$expr'" panel_data "$expr"
  n=$((n + 1))
done < <(jq -r '.panels[] | .title as $t | .targets[] | select(.expr | test("railyard_operator_(detection|recovery)_seconds"))
  | [$t, .expr] | @tsv' "$src/deploy/grafana/railyard-operator.json")
[ "$n" -ge 4 ] || fail "found $n time-to-detect/recover queries in deploy/grafana/railyard-operator.json, want >= 4"
echo "operator dashboard: $n time-to-detect/recover queries return data from Prometheus"
echo "restart loop e2e: ok"
