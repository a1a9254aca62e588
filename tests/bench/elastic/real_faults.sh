#!/usr/bin/env bash
# Benchmark (issue 44 item 2): what one fault costs the built-in trainer on real nodes, as lost goodput, and the
# goodput of a job under a fault every PERIOD seconds. A cluster of its own with 3 real nodes (kubelet + containerd +
# runc, pods as containers), the operator on the host; a 2-replica data-parallel job of the tiny model (every step in
# the pods' memory, a disk checkpoint every 10 steps, excludeFailedNodes false so that a node brought back serves
# again). Every fault hits rank 1 (pod <job>-worker-1); rank 0's container runs through all of them, so its log is one
# record, written by the trainer with this machine's clock, the same clock the faults are taken on.
#
# Part 1, per fault kind, ROUNDS rounds each, one after another in one long job:
#   kill   kill -9 of rank 1's trainer process (found from the host by its pod name: no kubectl exec on the clock)
#   pod    kubectl delete pod of rank 1 (the default grace: the agent stops the trainer, a replacement pod)
#   node   cluster.sh stop-node of rank 1's node (kubelet, containerd and containers SIGKILLed, as a lost machine);
#          start-node once the job trains again, so the next round has a spare node
# Per fault at T: r, the step the next generation restored (its first restore after T); s and t, the last step rank 0
# logged before that restore (the old generation may go on past T until the fault reaches it); t1, when rank 0 logged
# step r+1 after the restore; d, the median step time of the 30 steps before T. Lost goodput = (t1 - t) - (r + 1 - s)
# x d: the time the job spent beyond what the steps it advanced cost undisturbed (the steps redone, s - r, are in it).
# Recovery = t1 - T.
#
# Part 2, a fault schedule: the same job (steps for about SCHEDULE_SECONDS undisturbed) run to Succeeded undisturbed
# and with a fault every PERIOD seconds (kinds drawn from kill, pod, node by SEED), in SCHEDULE_PAIRS pairs that
# alternate which goes first. Two goodputs: between runs, steps per second from the first step to the last under
# faults over the same undisturbed (a pace estimated from part of one run was off by more than the faults cost, and
# the pace of whole runs can differ too); within the run, 1 - the faults' lost goodput (each measured as in part 1,
# against the pace of the 30 steps before it) over the time from the first step to the last. Beside them the job's own
# ledger (status.goodput.ratio: from the job's creation, checkpoint stalls counted as lost).
#
#   tests/bench/elastic/real_faults.sh BUILD_DIR [ROUNDS]
# Env: RAILYARD_BENCH_KINDS (default "kill pod node"), RAILYARD_BENCH_PERIOD (60), RAILYARD_BENCH_SCHEDULE_SECONDS
# (480: the schedule job's steps are sized to train about that long undisturbed; 0 skips part 2),
# RAILYARD_BENCH_SCHEDULE_PAIRS (2), RAILYARD_BENCH_SEED (7). Needs a quiet machine and no other real-node cluster;
# prints the load, the CPU flags and Markdown tables for docs/benchmarks.md.
set -euo pipefail
build=${1:?usage: real_faults.sh BUILD_DIR [ROUNDS]}
rounds=${2:-3}
build=$(cd "$build" && pwd)
src=${RAILYARD_SOURCE_DIR:-$(cd "$(dirname "$0")/../../.." && pwd)} # set: run a copy of this script
bin=$build/bin
kinds=${RAILYARD_BENCH_KINDS:-kill pod node}
period=${RAILYARD_BENCH_PERIOD:-60}
schedule_s=${RAILYARD_BENCH_SCHEDULE_SECONDS:-480}
seed=${RAILYARD_BENCH_SEED:-7}
pairs=${RAILYARD_BENCH_SCHEDULE_PAIRS:-2}
state=$build/bench-real-faults
cluster="$src/deploy/local/cluster.sh"
ns=bench-faults
work=$(mktemp -d /tmp/bench-real-faults.XXXXXX)
out=${RAILYARD_BENCH_OUT:-$build/bench/real-faults} # rank 0's log after each fault, kept
mkdir -p "$out"
op_pid=""
stopped=""
# shellcheck source=../../e2e/operator/lib.sh
source "$src/tests/e2e/operator/lib.sh"
trap cleanup_operator_cluster EXIT
die() {
  echo "real faults bench: $*" >&2
  kubectl get tj,pods -n "$ns" -o wide >&2 || true
  tail -n 20 "$work/op.log" >&2 || true
  exit 1
}
fail() { die "$@"; } # lib.sh's wait_for calls fail

for k in $kinds; do case "$k" in kill | pod | node) ;; *) die "RAILYARD_BENCH_KINDS: unknown kind '$k' (kill, pod, node)" ;; esac; done
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_bf16|amx_tile|amx_bf16)$' | tr '\n' ' ' || true)
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), flags: ${flags:-none of avx2/avx512f/avx512_bf16/amx}, $(date -u +%FT%TZ), commit $(git -C "$src" rev-parse --short HEAD)"
bash "$cluster" down --state-dir "$state" >/dev/null 2>&1 || true
bash "$cluster" up --state-dir "$state" --real-nodes 3 >"$work/up.log" 2>&1 || { tail -5 "$work/up.log"; die "cluster up"; }
eval "$(bash "$cluster" env --state-dir "$state")"
install_crd "$src"
shared=$(bash "$cluster" share "$ns" --state-dir "$state")
"$bin/railyard" data prepare --input /usr/share/common-licenses/* --output "$shared/data" >/dev/null
start_host_operator

job=""
jp() { kubectl get tj "$job" -n "$ns" -o jsonpath="$1" 2>/dev/null; }
# apply_job NAME STEPS: the tiny example on the shared claim, 2 replicas, every step in memory.
apply_job() {
  job=$1
  python3 "$src/tests/e2e/lib/example_on_claim.py" "$src/deploy/examples/tiny.yaml" railyard-shared |
    python3 -c '
import sys, yaml
j = yaml.safe_load(sys.stdin)
s = j["spec"]
j["metadata"]["name"] = sys.argv[1]
s["replicas"] = 2
s["training"].update(steps=int(sys.argv[2]), valEvery=0)
s["checkpoint"].update(path="/shared/checkpoints/" + sys.argv[1], intervalSteps=10, memoryIntervalSteps=1)
s["failurePolicy"].update(maxRestarts=1000, excludeFailedNodes=False)
print(yaml.safe_dump(j))' "$1" "$2" >"$work/$1.yaml"
  kubectl apply -n "$ns" -f "$work/$1.yaml" >/dev/null
}
# Rank 0's step and restore lines as "TIME step N" / "TIME restored N" (unix seconds, the trainer's own clock).
steps_of() {
  kubectl logs "$job-worker-0" -n "$ns" | python3 -c '
import datetime, re, sys
for l in sys.stdin:
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z \S+\s+(worker: step|checkpoint: restored) .*?step=(\d+)", l)
    if not m: continue
    t = datetime.datetime.fromisoformat(m.group(1)).replace(tzinfo=datetime.timezone.utc).timestamp()
    print(f"{t:.3f}", "step" if m.group(2) == "worker: step" else "restored", m.group(3))'
}
step_now() { steps_of | awk '$2 == "step" {s = $3} END {print s + 0}'; }
wait_steps() { # N: wait until rank 0 logged N more steps than now
  local want=$(($(step_now) + $1)) t=$SECONDS
  until [ "$(step_now)" -ge "$want" ]; do
    [ $((SECONDS - t)) -lt 240 ] || die "$job: no step $want after 240 s"
    sleep 0.5
  done
}
# kill -9 of the trainer process of POD, found from the host by the pod name in its environment.
kill_trainer() {
  python3 - "$1" <<'PY' || die "no trainer process of $1 on this machine"
import os, signal, sys
want = ("RAILYARD_POD_NAME=" + sys.argv[1]).encode()
for p in os.listdir("/proc"):
    if not p.isdigit():
        continue
    try:
        cmd = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
        env = open(f"/proc/{p}/environ", "rb").read().split(b"\0")
    except OSError:
        continue
    if any(c.endswith(b"railyard-worker") for c in cmd[:1]) and b"train" in cmd[1:2] and want in env:
        os.kill(int(p), signal.SIGKILL)
        sys.exit(0)
sys.exit(1)
PY
}
node_of() { kubectl get pod "$1" -n "$ns" -o jsonpath='{.spec.nodeName}'; }
inject() { # KIND: a fault on rank 1; prints nothing
  case "$1" in
    kill) kill_trainer "$job-worker-1" ;;
    pod) kubectl delete pod "$job-worker-1" -n "$ns" --wait=false >/dev/null ;;
    node)
      stopped=$(node_of "$job-worker-1")
      bash "$cluster" stop-node "$stopped" --state-dir "$state" >/dev/null
      ;;
  esac
}
bring_back() { # after a node fault: the node serves again
  [ -n "$stopped" ] || return 0
  bash "$cluster" start-node "$stopped" --state-dir "$state" >/dev/null
  wait_for 120 "$stopped Ready" sh -c "kubectl get node $stopped -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -q True"
  stopped=""
}
# measure T: "RECOVERY LOST REDONE RESTORED" for the fault at T, from rank 0's log, once step r+1 is logged.
measure() {
  local t=$1 line t0=$SECONDS
  while :; do
    line=$(steps_of | python3 -c '
import statistics, sys
T = float(sys.argv[1])
rows = [(float(t), k, int(s)) for t, k, s in (l.split() for l in sys.stdin)]  # in the order of the log
# The first restore after T, the last step of the old generation before it (it may have gone on past T until the fault
# reached it), and the first step of the new generation after it.
i = next((i for i, (t, k, s) in enumerate(rows) if k == "restored" and t >= T), None)
if i is None: sys.exit(1)
r = rows[i][2]
old = [(t, s) for t, k, s in rows[:i] if k == "step"]
t1 = next((t for t, k, s in rows[i + 1:] if k == "step" and s == r + 1), None)
if t1 is None or len(old) < 31: sys.exit(1)
t_last, s_last = old[-1]
before = [(t, s) for t, s in old if t < T][-31:]
d = statistics.median(b[0] - a[0] for a, b in zip(before, before[1:]) if b[1] == a[1] + 1)
print(f"{t1 - T:.2f} {(t1 - t_last) - (r + 1 - s_last) * d:.2f} {max(0, s_last - r)} {r} {d:.4f} "
      f"T={T:.3f} last={s_last}@{t_last:.3f} first={r + 1}@{t1:.3f}")' "$t") && { echo "$line"; return; }
    [ $((SECONDS - t0)) -lt 240 ] || die "$job: no step after a restore 240 s after the fault"
    sleep 1
  done
}

# --- Part 1: per fault kind ------------------------------------------------------------------------------------
results=$work/results.txt
: >"$results"
apply_job faults 1000000
wait_for 300 "faults Running" sh -c "[ \"\$(kubectl get tj faults -n $ns -o jsonpath='{.status.phase}')\" = Running ]"
wait_steps 40
for kind in $kinds; do
  for r in $(seq 1 "$rounds"); do
    sleep "0.$((RANDOM % 10))" # not always right after a step
    t=$(date +%s.%N)
    inject "$kind"
    read -r rec lost redone restored d raw <<<"$(measure "$t")"
    kubectl logs "$job-worker-0" -n "$ns" >"$out/$kind-$r.worker-0.log" 2>&1 || true
    echo "$kind round $r: recovery $rec s, lost goodput $lost s, steps redone $redone (restored step $restored, step ${d}s; $raw), generation $(jp '{.status.generation}'), load $(cut -d' ' -f1 /proc/loadavg)"
    echo "$kind $rec $lost $redone" >>"$results"
    echo "$d" >"$work/d.txt"
    bring_back
    wait_steps 40 # 30 undisturbed steps before the next fault's d
  done
done
echo "ledger of the per-fault job: $(jp '{.status.goodput.seconds}') ratio $(jp '{.status.goodput.ratio}'), restarts $(jp '{.status.restarts}')"
kubectl delete tj faults -n "$ns" --wait=true >/dev/null 2>&1 || true
wait_for 120 "faults' pods gone" sh -c "[ -z \"\$(kubectl get pods -n $ns -l railyard.dev/job=faults -o name)\" ]"

# --- Part 2: a fault every PERIOD seconds, against the same job undisturbed -------------------------------------------
# first_last: "STEPS SECONDS" between the first and the last step rank 0 of $job logged.
first_last() { steps_of | awk '$2 == "step" {if (t0 == "") {t0 = $1; s0 = $3}; t1 = $1; s1 = $3} END {printf "%d %.1f\n", s1 - s0, t1 - t0}'; }
# run_schedule NAME FAULTS: the job of $steps steps to Succeeded, with a fault every PERIOD seconds when FAULTS is 1;
# appends "NAME STEPS SECONDS FAULTS RESTARTS LEDGER_RATIO" to $work/sched.txt.
run_schedule() {
  local name=$1 faulty=$2 n=0 next kind
  apply_job "$name" "$steps"
  wait_for 300 "$name Running" sh -c "[ \"\$(kubectl get tj $name -n $ns -o jsonpath='{.status.phase}')\" = Running ]"
  wait_steps 40
  local limit=$((SECONDS + schedule_s * 4 + 300))
  while [ "$(jp '{.status.phase}')" != Succeeded ]; do
    [ $SECONDS -lt $limit ] || die "$name not Succeeded after $((schedule_s * 4 + 300)) s"
    if [ "$faulty" = 0 ]; then
      sleep 1
      continue
    fi
    next=$((SECONDS + period))
    while [ $SECONDS -lt $next ] && [ "$(jp '{.status.phase}')" != Succeeded ]; do sleep 1; done
    [ "$(jp '{.status.phase}')" != Succeeded ] || break
    [ "$(step_now)" -lt $((steps - 30)) ] || continue # no fault in the last steps: the job would end before recovering
    kind=${kind_list[$((RANDOM % ${#kind_list[@]}))]}
    t=$(date +%s.%N)
    inject "$kind"
    n=$((n + 1))
    read -r rec lost redone restored d raw <<<"$(measure "$t")"
    echo "$name: fault $n ($kind) at step $(step_now): recovery $rec s, lost goodput $lost s, steps redone $redone (step ${d}s before it), load $(cut -d' ' -f1 /proc/loadavg)"
    echo "$name $kind $rec $lost $redone $d" >>"$work/sched-faults.txt"
    wait_steps 5
    bring_back
  done
  local ratio
  ratio=$(jp '{.status.goodput.ratio}')
  echo "$name: Succeeded, $(first_last) (steps, seconds from the first step to the last), $n faults, restarts $(jp '{.status.restarts}'), ledger ratio ${ratio:-none} seconds $(jp '{.status.goodput.seconds}'), load $(cut -d' ' -f1 /proc/loadavg)"
  echo "$name $(first_last) $n $(jp '{.status.restarts}') ${ratio:-none}" >>"$work/sched.txt"
  kubectl delete tj "$name" -n "$ns" --wait=true >/dev/null 2>&1 || true
  wait_for 120 "$name's pods gone" sh -c "[ -z \"\$(kubectl get pods -n $ns -l railyard.dev/job=$name -o name)\" ]"
}
if [ "$schedule_s" -gt 0 ]; then
  # Steps for about schedule_s seconds undisturbed, at part 1's step time (rank 0 of the same layout).
  d=$(cat "$work/d.txt" 2>/dev/null || echo 0.1)
  steps=$(python3 -c "print(int($schedule_s / $d))")
  RANDOM=$seed
  read -r -a kind_list <<<"$kinds"
  # Pairs of the same job undisturbed and under faults, alternating which goes first.
  for p in $(seq 1 "$pairs"); do
    if [ $((p % 2)) = 1 ]; then
      run_schedule "calm-$p" 0
      run_schedule "faulty-$p" 1
    else
      run_schedule "faulty-$p" 1
      run_schedule "calm-$p" 0
    fi
  done
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
touch "$work/sched-faults.txt"
python3 - "$results" "$work/sched.txt" "$period" "$work/sched-faults.txt" <<'PY'
import os, statistics, sys
rows = {}
for l in open(sys.argv[1]):
    k, rec, lost, redone = l.split()
    rows.setdefault(k, []).append((float(rec), float(lost), int(redone)))
goal = {"kill": 1, "pod": 3, "node": 5}
print("| fault | rounds | lost goodput: median (min-max) | goal | recovery (fault -> first new step): median (min-max) | steps redone: max |")
print("|---|---|---|---|---|---|")
for k, v in rows.items():
    rec = [x[0] for x in v]; lost = [x[1] for x in v]
    print(f"| {k} | {len(v)} | {statistics.median(lost):.2f} s ({min(lost):.2f}-{max(lost):.2f}) | <= {goal[k]} s | "
          f"{statistics.median(rec):.2f} s ({min(rec):.2f}-{max(rec):.2f}) | {max(x[2] for x in v)} |")
if os.path.exists(sys.argv[2]) and os.path.getsize(sys.argv[2]):
    runs = {}
    for l in open(sys.argv[2]):
        name, steps, secs, faults, restarts, ledger = l.split()
        kind, pair = name.split("-")
        runs.setdefault(pair, {})[kind] = (int(steps), float(secs), int(faults), ledger)
    g, lines = [], []
    lost_in = {}  # faulty run -> its faults' lost goodput, each measured as in part 1 (the pace before it)
    for l in open(sys.argv[4]):
        name, kind, rec, lost, redone, d = l.split()
        lost_in.setdefault(name.split("-")[1], []).append(float(lost))
    inrun = []
    for pair, r in sorted(runs.items()):
        if "faulty" in r:
            fs, ft, fn, fl = r["faulty"]
            inrun.append((ft - sum(lost_in.get(pair, []))) / ft)
            print(f"faulty-{pair}: {fn} faults lost {sum(lost_in.get(pair, [])):.1f} s of {ft:.1f} s (each against the "
                  f"pace of the 30 steps before it): goodput {inrun[-1]:.3f}")
        if "calm" not in r or "faulty" not in r:
            continue
        (cs, ct, _, _), (fs, ft, fn, fl) = r["calm"], r["faulty"]
        g.append((fs / ft) / (cs / ct))  # steps per second under faults over steps per second undisturbed
        lines.append(f"pair {pair}: undisturbed {cs} steps in {ct:.1f} s, under faults {fs} in {ft:.1f} s with {fn} faults "
                     f"(ledger {fl}): {g[-1]:.3f}")
    if inrun:
        print(f"Schedule, within the run: goodput 1 - (lost to faults) / (first step to last): median "
              f"{statistics.median(inrun):.3f} ({min(inrun):.3f}-{max(inrun):.3f}) over {len(inrun)} runs; goal >= 0.95.")
    if not g:
        sys.exit("no complete pair of schedule runs")
    print()
    print(f"Schedule: a fault every {sys.argv[3]} s; goodput against the same job undisturbed (steps per second, first "
          f"step to last): median {statistics.median(g):.3f} ({min(g):.3f}-{max(g):.3f}) over {len(g)} pairs; goal >= 0.95.")
    for l in lines:
        print("  " + l)
PY
