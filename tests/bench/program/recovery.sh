#!/usr/bin/env bash
# Benchmark (issue #25): recovery of the PyTorch example (deploy/examples/pytorch-ddp.yaml, 2 ranks over gloo, a
# checkpoint every 20 steps, --step-sleep 0.05) per failure flow, on a cluster of its own with 3 real nodes, the
# operator and railyard-monitor (embedded mode) on the host. Per round: the job trains past step 40, the fault is
# injected at T (host clock), and the time to the first step completed after the script resumed is read from rank
# 0's log with the container runtime's timestamps (same clock). Flows:
#   kill      kill -9 of rank 1's python (the agent reports the exit; in-place restart)
#   hang      SIGSTOP of rank 1's python (the monitor's stall rule from the progress the agent serves)
#   silence   the same with --no-progress and hangTimeoutSeconds 20 (the silence rule: >= 20 s by design)
#   node      cluster.sh stop-node of rank 1's node (NotReady, the pod replaced on the third node), then start-node
#   scale     kubectl scale 2 -> 3 (failure = the scale; first step of the world of 3)
# Prints one line per round and a Markdown table (median, range, steps lost) for docs/benchmarks.md. Needs a quiet
# machine and no other real-node cluster.
#   tests/bench/program/recovery.sh BUILD_DIR [ROUNDS]      (RAILYARD_BENCH_FLOWS picks flows)
set -euo pipefail
build=${1:?usage: recovery.sh BUILD_DIR [ROUNDS]}
rounds=${2:-3}
build=$(cd "$build" && pwd)
src=$(cd "$(dirname "$0")/../../.." && pwd)
bin=$build/bin
flows=${RAILYARD_BENCH_FLOWS:-kill hang silence node scale}
state=$build/bench-program-recovery
cluster="$src/deploy/local/cluster.sh"
ns=bench-program
job=pytorch-ddp
work=$(mktemp -d /tmp/bench-program.XXXXXX)
op_pid="" mon_pid=""
cleanup() {
  for p in $op_pid $mon_pid; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
  bash "$cluster" down --state-dir "$state" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
die() {
  echo "recovery bench: $*" >&2
  kubectl get tj,pods -n "$ns" -o wide >&2 || true
  exit 1
}
# shellcheck source=../../e2e/operator/lib.sh
source "$src/tests/e2e/operator/lib.sh"
fail() { die "$@"; } # lib.sh's wait_for calls fail

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs, $(date -u +%FT%TZ)"
bash "$cluster" up --state-dir "$state" --real-nodes 3 >"$work/up.log" 2>&1 || { tail -5 "$work/up.log"; die "cluster up"; }
eval "$(bash "$cluster" env --state-dir "$state")"
socks=()
for d in "$state"/real/ry-real-*/run/containerd.sock; do socks+=(--load "$d"); done
bash "$src/deploy/images/build.sh" --build-dir "$build" --examples "${socks[@]}" >"$work/images.log" 2>&1 ||
  { tail -5 "$work/images.log"; die "images"; }
install_crd "$src"
shared=$(bash "$cluster" share "$ns" --state-dir "$state")
start_host_operator
"$bin/railyard-monitor" --namespace "$ns" --listen 127.0.0.1:0 --interval 1 >"$work/mon.log" 2>&1 &
mon_pid=$!

jp() { kubectl get tj "$job" -n "$ns" -o jsonpath="$1" 2>/dev/null; }
apply_job() { # HANG_TIMEOUT [ARG...]
  kubectl delete tj "$job" -n "$ns" --wait=true >/dev/null 2>&1 || true
  wait_for 120 "the previous job's pods gone" sh -c "[ -z \"\$(kubectl get pods -n $ns -l railyard.dev/job=$job -o name)\" ]"
  rm -rf "$shared/checkpoints/$job"
  python3 - "$src/deploy/examples/pytorch-ddp.yaml" "$@" >"$work/job.yaml" <<'PY'
import sys, yaml
j = yaml.safe_load(open(sys.argv[1]))
j["spec"]["program"]["args"] = ["--step-sleep", "0.05"] + sys.argv[3:]
j["spec"]["failurePolicy"]["hangTimeoutSeconds"] = int(sys.argv[2])
print(yaml.safe_dump(j))
PY
  kubectl apply -n "$ns" -f "$work/job.yaml" >/dev/null
}
signal_rank() { # POD SIGNAL
  kubectl exec "$1" -n "$ns" -- python3 -c '
import os, signal, sys
for p in os.listdir("/proc"):
    if p.isdigit() and int(p) != os.getpid() and open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")[1:2] == [b"/app/train_gpt.py"]:
        print("signalled", p, flush=True); os.kill(int(p), getattr(signal, sys.argv[1]))' "$2" | grep -q signalled ||
    die "no python rank in $1"
}
# The last "step N/" line of worker-0 at or before time T (unix seconds), from the runtime's timestamps.
reached_at() {
  kubectl logs --timestamps "$job-worker-0" -n "$ns" | python3 -c '
import sys, datetime
t = float(sys.argv[1]); last = ""
for l in sys.stdin:
    ts, _, msg = l.partition(" ")
    when = datetime.datetime.fromisoformat(ts[:26].rstrip("Z")).replace(tzinfo=datetime.timezone.utc).timestamp()
    if msg.startswith("step ") and when <= t: last = msg.split()[1].split("/")[0]
print(last)' "$1"
}
# "RESUMED FIRST_STEP_TIME" from POD's log: the step the script resumed at, and when it completed its first step after.
first_after_resume() {
  kubectl logs --timestamps "$1" -n "$ns" | python3 -c '
import sys, datetime
resumed = None
for l in sys.stdin:
    ts, _, msg = l.partition(" ")
    when = datetime.datetime.fromisoformat(ts[:26].rstrip("Z")).replace(tzinfo=datetime.timezone.utc).timestamp()
    if msg.startswith("resumed from"): resumed = msg.split(" at step ")[1].split()[0]
    elif resumed is not None and msg.startswith("step "): print(resumed, when); break'
}
past() { wait_for 180 "past step $1" sh -c "kubectl logs $job-worker-0 -n $ns 2>/dev/null | grep -q '^step $1/'"; }

results=$work/results.txt
: >"$results"
for flow in $flows; do
  for r in $(seq 1 "$rounds"); do
    case "$flow" in silence) apply_job 20 --no-progress ;; *) apply_job 60 ;; esac
    past 40
    sleep "0.$((RANDOM % 10))" # not always right after a checkpoint
    pod=$job-worker-0
    t=$(date +%s.%N)
    case "$flow" in
      kill) signal_rank "$job-worker-1" SIGKILL ;;
      hang | silence) signal_rank "$job-worker-1" SIGSTOP ;;
      node)
        lost=$(kubectl get pod "$job-worker-1" -n "$ns" -o jsonpath='{.spec.nodeName}')
        bash "$cluster" stop-node "$lost" --state-dir "$state" >/dev/null
        ;;
      scale)
        kubectl scale tj "$job" -n "$ns" --replicas 3 >/dev/null
        pod=$job-worker-2
        ;;
    esac
    reached=$(reached_at "$t")
    wait_for 180 "the first step after the resume ($flow)" sh -c "kubectl logs $pod -n $ns 2>/dev/null | grep -q '^resumed from' && kubectl logs $job-worker-0 -n $ns 2>/dev/null | sed -n '/^resumed from/,\$p' | grep -q '^step '"
    read -r resumed when <<<"$(first_after_resume "$job-worker-0")"
    secs=$(python3 -c "print(f'{$when - $t:.2f}')")
    lost_steps=$((reached - resumed))
    echo "$flow round $r: failure -> first new step $secs s, reached $reached, resumed $resumed, lost $lost_steps"
    echo "$flow $secs $lost_steps" >>"$results"
    if [ "$flow" = node ]; then
      bash "$cluster" start-node "$lost" --state-dir "$state" >/dev/null
      wait_for 120 "$lost Ready" sh -c "kubectl get node $lost -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -q True"
    fi
  done
done
kubectl delete tj "$job" -n "$ns" --wait=true >/dev/null 2>&1 || true
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$results" <<'PY'
import statistics, sys
rows = {}
for l in open(sys.argv[1]):
    f, s, lost = l.split()
    rows.setdefault(f, []).append((float(s), int(lost)))
print("| flow | rounds | failure -> first new step: median (range) | steps lost: max |")
print("|---|---|---|---|")
for f, v in rows.items():
    s = [x for x, _ in v]
    print(f"| {f} | {len(v)} | {statistics.median(s):.2f} s ({min(s):.2f}-{max(s):.2f}) | {max(l for _, l in v)} |")
PY
