#!/usr/bin/env bash
# Real nodes against simulated nodes, side by side (docs/benchmarks.md "Real nodes"). Run on a quiet machine: nothing
# else of ours running. Per round, alternating the kind first:
#   - cluster up with 2 nodes (the caches warm: Kubernetes binaries, images' base layer);
#   - the tiny example's wall time (apply -> Succeeded);
#   - kill -9 of the trainer of a 1-pod job: failure -> first step logged after the restore;
#   - a lost node (real: cluster.sh stop-node; simulated: node-agent node-down): failure -> first step after restore.
# Also once: the image build with its cache warm, and cold when --cold is given (the base layer rebuilt by debootstrap).
#   tests/bench/local/real_vs_simulated.sh [--rounds N] [--build-dir build] [--cold]
set -euo pipefail
src="$(cd "$(dirname "$0")/../../.." && pwd)"
rounds=3
build="$src/build"
cold=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --build-dir) build=$(realpath "$2"); shift 2 ;;
    --cold) cold=1; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
bin=$build/bin
cluster="$src/deploy/local/cluster.sh"
work=$(mktemp -d /tmp/real-bench.XXXXXX)
state=$work/cluster
op_pid=""
results=$work/results.txt
# shellcheck source=../../e2e/operator/lib.sh
source "$src/tests/e2e/operator/lib.sh"
trap cleanup_operator_cluster EXIT
fail() { echo "FAIL: $*" >&2; tail -20 "$work/op.log" >&2 || true; exit 1; }
now() { date +%s.%N; }
record() { echo "$1 $2 $3" >>"$results"; printf '  %-9s %-22s %6.2f s\n' "$1" "$2" "$3"; }
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

images_time() {
  local t
  t=$(now)
  bash "$src/deploy/images/build.sh" --build-dir "$build" >/dev/null 2>&1
  python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$t" "$(now)"
}
if [ "$cold" = 1 ]; then
  rm -f "${RAILYARD_CACHE_DIR:-$HOME/.cache/railyard}"/images/base-*.tar.gz* "$build"/images/*.tar
  record images build-cold "$(images_time)"
fi
record images build-cached "$(images_time)"

# The log of a pod as text, for either kind.
pod_log() { # kind pod
  if [ "$1" = real ]; then kubectl logs "$2" -n bench 2>/dev/null || true; else
    cat "$state/node-agent/pods/bench_$2/worker.log" 2>/dev/null || true
  fi
}
# Seconds from FAILURE_TIME to the first step logged after the last "checkpoint: restored" in the pod's log.
recovered_after() { # kind pod failure_time
  local t
  t=$(pod_log "$1" "$2" | python3 -c '
import calendar, sys
from datetime import datetime
lines = sys.stdin.read().splitlines()
idx = [i for i, l in enumerate(lines) if "checkpoint: restored " in l]
if not idx: sys.exit(1)
for l in lines[idx[-1]:]:
    if "worker: step step=" in l:
        d = datetime.strptime(l[:23], "%Y-%m-%dT%H:%M:%S.%f")
        print(calendar.timegm(d.timetuple()) + d.microsecond / 1e6); sys.exit(0)
sys.exit(1)') || return 1
  python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$3" "$t"
}
trainer_kill() { # kind pod
  if [ "$1" = real ]; then
    kubectl exec "$2" -n bench -- sh -c 'for d in /proc/[0-9]*; do
      tr "\0" " " <"$d/cmdline" 2>/dev/null | grep -q "[r]ailyard-worker train" && kill -9 "${d#/proc/}"; done; true'
  else
    local uid agent
    uid=$(kubectl get pod "$2" -n bench -o jsonpath='{.metadata.uid}')
    agent=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]]["pid"])' \
      "$state/node-agent/processes.json" "$uid")
    kill -9 "$(pgrep -P "$agent" | head -1)"
  fi
}
job() { # name steps
  sed -e "s|name: tiny|name: $1|" -e "s|steps: 200|steps: $2|" -e "s|/shared/checkpoints/tiny|/shared/checkpoints/$1|" \
    -e "s|intervalSteps: 50|intervalSteps: 10|" <(python3 "$src/tests/e2e/lib/example_on_claim.py" "$src/deploy/examples/tiny.yaml" $claim) |
    job_paths | kubectl apply -n bench -f - >/dev/null
}
phase() { kubectl get tj "$1" -n bench -o jsonpath='{.status.phase}' 2>/dev/null; }
wait_phase() { # job phase
  local t=$SECONDS
  until [ "$(phase "$1")" = "$2" ]; do
    [ $((SECONDS - t)) -lt 600 ] || fail "$1 not $2"
    sleep 0.2
  done
}
wait_step() { # job step
  wait_for 120 "$1 at step $2" sh -c "s=\$(kubectl get tj $1 -n bench -o jsonpath='{.status.step}'); [ \"\${s:-0}\" -ge $2 ]"
}

round() { # kind
  local kind=$1 t up_args=()
  bash "$cluster" down --state-dir "$state" >/dev/null 2>&1 || true
  if [ "$kind" = real ]; then up_args=(--real-nodes 2); else up_args=(--nodes 2 --node-agent "$bin/railyard-node-agent"); fi
  t=$(now)
  RAILYARD_BUILD_DIR=$build bash "$cluster" up --state-dir "$state" "${up_args[@]}" >"$work/up.log" 2>&1 ||
    { cat "$work/up.log"; fail "up"; }
  record "$kind" cluster-up "$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$t" "$(now)")"
  eval "$(bash "$cluster" env --state-dir "$state")"
  install_crd "$src"
  local opargs
  if [ "$kind" = real ]; then
    data="$(bash "$cluster" share bench --state-dir "$state")/data"
    opargs=(--worker-image localhost/railyard/worker:0.1.0 --rendezvous-bind "$RAILYARD_POD_HOST_ADDR:0")
    job_paths() { cat; }
    claim=railyard-shared  # the data prepared once for every round, on the shared claim
  else
    kubectl create namespace bench >/dev/null
    data=$work/shared/data  # the examples' /shared, on this machine (job_paths)
    opargs=(--worker-command "$bin/railyard-worker" --rendezvous-bind 127.0.0.1:0)
    job_paths() { sed -e "s|/shared/|$work/shared/|g"; }
    claim=""
  fi
  "$bin/railyard" data prepare --force --input /usr/share/common-licenses/* --output "$data" >/dev/null
  "$bin/railyard-operator" --namespace bench --leader-elect=false "${opargs[@]}" \
    --metrics-addr "127.0.0.1:$(free_port)" --health-addr "127.0.0.1:$(free_port)" >"$work/op.log" 2>&1 &
  op_pid=$!
  t=$(now)
  job tiny 200
  wait_phase tiny Succeeded
  record "$kind" tiny-wall "$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$t" "$(now)")"
  # kill -9, then a lost node, in one 3000-step job.
  job ft 3000
  wait_step ft 100
  t=$(now)
  trainer_kill "$kind" ft-worker-0
  wait_for 60 "ft restored after kill -9" recovered_after "$kind" ft-worker-0 "$t"
  record "$kind" recover-kill9 "$(recovered_after "$kind" ft-worker-0 "$t")"
  wait_step ft 600
  local node
  node=$(kubectl get pod ft-worker-0 -n bench -o jsonpath='{.spec.nodeName}')
  uid=$(kubectl get pod ft-worker-0 -n bench -o jsonpath='{.metadata.uid}')
  t=$(now)
  if [ "$kind" = real ]; then bash "$cluster" stop-node "$node" --state-dir "$state" >/dev/null; else
    "$bin/railyard-node-agent" node-down "$node" --state-dir "$state/node-agent" >/dev/null
  fi
  wait_for 120 "ft re-created" sh -c "u=\$(kubectl get pod ft-worker-0 -n bench -o jsonpath='{.metadata.uid}'); [ -n \"\$u\" ] && [ \"\$u\" != $uid ]"
  wait_for 120 "ft restored after node loss" recovered_after "$kind" ft-worker-0 "$t"
  record "$kind" recover-node-loss "$(recovered_after "$kind" ft-worker-0 "$t")"
  kill "$op_pid" 2>/dev/null && wait "$op_pid" 2>/dev/null || true
  op_pid=""
}

for ((r = 1; r <= rounds; r++)); do
  echo "round $r (load $(cut -d' ' -f1 /proc/loadavg))"
  if ((r % 2)); then round real; round simulated; else round simulated; round real; fi
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$results" <<'PY'
import statistics, sys
from collections import defaultdict
d = defaultdict(list)
for line in open(sys.argv[1]):
    k, m, v = line.split()
    d[(k, m)].append(float(v))
print(f"{'measure':22} {'real median [min-max]':28} {'simulated median [min-max]':28} ratio real/sim median [min-max]")
for m in ["cluster-up", "tiny-wall", "recover-kill9", "recover-node-loss"]:
    r, s = d.get(("real", m), []), d.get(("simulated", m), [])
    if not r or not s:
        continue
    ratios = [a / b for a, b in zip(r, s)]
    f = lambda x: f"{statistics.median(x):6.2f} [{min(x):.2f}-{max(x):.2f}]"
    print(f"{m:22} {f(r):28} {f(s):28} {f(ratios)}")
for m in ["build-cold", "build-cached"]:
    if ("images", m) in d:
        print(f"images {m}: {d[('images', m)][0]:.2f} s")
PY
