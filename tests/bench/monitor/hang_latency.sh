#!/usr/bin/env bash
# Hang detection latency at the default settings: a real Prometheus (1 s scrapes, deploy/prometheus/
# prometheus-local.yml) scrapes two fake workers stepping every STEP seconds in lock step; railyard-monitor runs with
# its defaults (--interval 1, stall threshold max(2 x step time, 6 s)); rank 1 is frozen with SIGSTOP and the time
# until the restart-request annotation is on the TrainingJob is measured, REPS times (a fresh job each time).
#   tests/bench/monitor/hang_latency.sh CLUSTER_STATE_DIR BUILD_DIR [REPS] [STEP_SECONDS]
set -euo pipefail
state=$(realpath "${1:?cluster state dir (cluster.sh up --state-dir)}")
build=$(realpath "${2:?build dir}")
reps=${3:-5}
step=${4:-0.2}
src=$(cd "$(dirname "$0")/../../.." && pwd)
eval "$(bash "$src/deploy/local/cluster.sh" env --state-dir "$state")"
tmp=$(mktemp -d /tmp/railyard-hang-bench-XXXXXX)
ns=hang-bench-$$
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  bash "$src/deploy/local/lib/prometheus.sh" down "$tmp/prom" || true
  kubectl delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

kubectl apply -f "$src/deploy/crds/trainingjobs.railyard.dev.yaml" >/dev/null
kubectl wait --for=condition=Established --timeout=60s crd/trainingjobs.railyard.dev >/dev/null
kubectl create namespace "$ns" >/dev/null
bash "$src/deploy/local/lib/prometheus.sh" up "$tmp/prom" 2>/dev/null
# shellcheck disable=SC1091
source "$tmp/prom/prometheus/prometheus.env"
mport=$((20000 + SRANDOM % 12000))
"$build/bin/railyard-monitor" --kubeconfig "$KUBECONFIG" --prometheus-url "$PROMETHEUS_URL" \
  --listen "127.0.0.1:$mport" --namespace "$ns" 2>"$tmp/monitor.log" &
monitor=$!
pids+=("$monitor")

now() { date +%s.%N; }
results=()
for rep in $(seq 1 "$reps"); do
  job=job-$rep
  kubectl apply -n "$ns" -f - >/dev/null <<EOF2
apiVersion: railyard.dev/v1alpha1
kind: TrainingJob
metadata: {name: $job}
spec: {replicas: 2, model: {preset: tiny}, data: {train: /tmp/none_*.bin}, training: {steps: 100000}}
EOF2
  mkdir -p "$tmp/$job/barrier"
  wpids=()
  for r in 0 1; do
    "$build/bin/railyard-test-fake-worker" --namespace "$ns" --job "$job" --rank $r --world 2 --node "sim-$r" \
      --step-seconds "$step" --port-file "$tmp/$job/port$r" --barrier-dir "$tmp/$job/barrier" 2>/dev/null &
    wpids+=($!)
    pids+=($!)
  done
  for r in 0 1; do until [ -s "$tmp/$job/port$r" ]; do sleep 0.05; done; done
  bash "$src/deploy/local/lib/prometheus.sh" write-targets "$tmp/prom" workers \
    "[{\"targets\":[\"127.0.0.1:$(cat "$tmp/$job/port0")\"],\"labels\":{\"namespace\":\"$ns\",\"trainingjob\":\"$job\",\"pod\":\"$job-worker-0\",\"node\":\"sim-0\"}},
      {\"targets\":[\"127.0.0.1:$(cat "$tmp/$job/port1")\"],\"labels\":{\"namespace\":\"$ns\",\"trainingjob\":\"$job\",\"pod\":\"$job-worker-1\",\"node\":\"sim-1\"}}]"
  # Wait until Prometheus has both ranks stepping, then a few more evaluations of a healthy job.
  deadline=$((SECONDS + 30))
  until [ "$(curl -fsS "$PROMETHEUS_URL/api/v1/query" --data-urlencode "query=count(railyard_worker_step{trainingjob=\"$job\"} > 3)" |
    sed -n 's/.*"value":\[[0-9.]*,"\([0-9]*\)"\].*/\1/p')" = 2 ]; do
    [ $SECONDS -lt $deadline ] || { echo "targets not scraped in 30 s" >&2; exit 1; }
    sleep 0.2
  done
  sleep 5
  t0=$(now)
  kill -STOP "${wpids[1]}"
  until kubectl get tj -n "$ns" "$job" -o jsonpath='{.metadata.annotations.railyard\.dev/restart-request}' | grep -q generation; do
    sleep 0.1
    awk -v a="$(now)" -v b="$t0" 'BEGIN{exit !(a-b > 120)}' && { echo "no detection in 120 s" >&2; exit 1; }
  done
  t1=$(now)
  lat=$(awk -v a="$t1" -v b="$t0" 'BEGIN{printf "%.2f", a-b}')
  req=$(kubectl get tj -n "$ns" "$job" -o jsonpath='{.metadata.annotations.railyard\.dev/restart-request}')
  echo "rep $rep: detected in $lat s: $req"
  results+=("$lat")
  for p in "${wpids[@]}"; do kill -CONT "$p"; kill "$p"; wait "$p" 2>/dev/null || true; done
done
printf '%s\n' "${results[@]}" | sort -n | awk '{a[NR]=$1} END {printf "hang detection latency over %d runs: min %.2f s, median %.2f s, max %.2f s (step %s s, default threshold max(2 x step, 6 s))\n", NR, a[1], a[int((NR+1)/2)], a[NR], "'"$step"'"}'
