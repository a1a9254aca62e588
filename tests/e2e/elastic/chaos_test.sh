#!/usr/bin/env bash
# E2E chaos (issue #10): random failures of several kinds, every few steps, through one long run of the real
# trainer; the job must end Succeeded with the undisturbed run's final loss and, bitwise, its final parameters.
#
# A 2-replica data-parallel job (tiny model, deterministic mode, checkpoint every 5 steps, in-memory tier every step,
# maxRestarts 100) trains RAILYARD_CHAOS_STEPS steps. Faults come in rounds; each round is a seeded permutation of the
# kinds (RAILYARD_CHAOS_KINDS, default all five), so every kind fires once per round:
#   kill      kill -9 of a random rank's trainer (flow 1: in place, restore from memory)
#   pod       kubectl delete pod of a random rank (flow 2/5: replacement, save on SIGTERM)
#   node      railyard-node-agent node-down of a random rank's node, node-up once the job runs again (flow 2: the
#             pod is replaced on a healthy node; with RAILYARD_CHAOS_CONFINE=UNIT the job is confined to that unit
#             with minReplicas 1, so the same fault is a shrink and then a grow: flow 4)
#   operator  kill -9 of the operator, restarted 0.5-3 s later (flow 6)
#   hang      SIGSTOP of a random rank's trainer: its agent finds it stopped and reports it (docs/rendezvous.md "Hangs
#             the agent finds"; no monitor runs here), the generation restarts in place and restores from memory
# The next fault comes once the job has trained a seeded 5-12 more steps (RAILYARD_CHAOS_GAP_SECONDS=S instead waits
# S seconds), while the fault window RAILYARD_CHAOS_SECONDS (default 60) lasts and the job is not near its end.
# RAILYARD_CHAOS_SEED (default: random, printed) makes the sequence of kinds, targets and gaps reproducible; the
# timing of each fault against the training is not (the machine's speed decides which step a fault hits).
#
# Asserted: Succeeded with every step; each kill/pod/node fault opened a new generation and each operator restart
# none; status.restarts = generation - 1 (every restart is one generation: none lost, none counted twice) and at most
# two per fault (kept loose: since a pod lost before it joins a forming generation is replaced into it, a node loss
# should count one, but this test was not re-run with that change; docs/elastic.md); steps lost 0 for a
# kill (restored from memory), at most 1 for a hang (restored from memory; the stopped trainer, continued to save on
# SIGTERM, may finish the step it was in) and at most the checkpoint interval (5) otherwise, except that a disk restore loses the
# steps since the newest step rank 0 had committed (it must restore that one; the next save may still have been
# persisting when the node died, so up to the interval plus that save's persist time); final loss and parameters equal to the
# undisturbed run's. Per fault: detection (until the agents hear of the new generation), recovery (until the first
# step of the new generation is done), steps lost. With RAILYARD_RESULTS_DIR set, writes elastic_chaos.json
# (scripts/reliability_report.py); RAILYARD_CHAOS_RESULT=FILE writes the same JSON elsewhere (the benchmark).
set -euo pipefail
job_name=chaos
job_memory=1
job_deterministic=1
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
t_start=$SECONDS
secs=${RAILYARD_CHAOS_SECONDS:-45}
seed=${RAILYARD_CHAOS_SEED:-$((RANDOM * 32768 + RANDOM))}
kinds=${RAILYARD_CHAOS_KINDS-kill pod node operator hang} # set and empty: no faults (the benchmark's baseline)
confine=${RAILYARD_CHAOS_CONFINE:-}
steps=${RAILYARD_CHAOS_STEPS:-$((secs * 10 > 700 ? secs * 10 : 700))}
gap_secs=${RAILYARD_CHAOS_GAP_SECONDS:-}
for k in $kinds; do
  case "$k" in kill | pod | node | operator | hang) ;; *) fail "RAILYARD_CHAOS_KINDS: unknown kind '$k' (kill, pod, node, operator, hang)" ;; esac
done
echo "chaos: seed $seed (RAILYARD_CHAOS_SEED=$seed reproduces the sequence), kinds '$kinds', window ${secs} s, $steps steps${confine:+, confined to unit $confine (node = shrink/grow)}"
rdzv_port=$(free_port)
op_extra="--rendezvous-bind 127.0.0.1:$rdzv_port"
start_operator
if [ -n "$confine" ]; then
  job_yaml "$job_name" 2 "$steps" 1 "$confine"
else
  job_yaml "$job_name" 2 "$steps"
fi | sed 's/maxRestarts: 3/maxRestarts: 100/' | kubectl apply -n "$ns" -f - >/dev/null
wait_for 90 "the job to run" phase_is Running
wait_for 90 "a first checkpoint" latest_at_least 5

# A seeded stream of choices: rng N prints a number in [0, N).
exec 3< <(python3 -c "
import random, sys
r = random.Random($seed)
while True:
    try:
        print(r.random(), flush=True)
    except BrokenPipeError:
        break
")
rng() {
  local x
  read -r x <&3
  python3 -c "print(int($x * $1))"
}
round=()
# fill_round: a new seeded permutation of the kinds into `round` when it is empty (not in a subshell: it keeps state).
fill_round() {
  [ ${#round[@]} -eq 0 ] || return 0
  local k i j t
  for k in $kinds; do round+=("$k"); done
  for ((i = ${#round[@]} - 1; i > 0; i--)); do # Fisher-Yates with the seeded stream
    j=$(rng $((i + 1)))
    t=${round[$i]} round[i]=${round[$j]} round[j]=$t
  done
}
status_step() { local s; s=$(grep -oE 'worker: step step=[0-9]+' "$(pod_log "$job_name-worker-0")" 2>/dev/null | tail -1 | cut -d= -f2); echo "${s:-0}"; }
gen_now() { jp '{.status.generation}'; }
# True once rank 0 trained step $1 (or the job has finished: the loop then stops injecting). Not the phase: the
# operator refreshes it from the rendezvous service only every 5 s while the world runs.
running_again() { phase_is Succeeded || [ "$(status_step)" -ge "$1" ]; }

wait_for 60 "the first steps" running_again 5
faults=$work/faults.tsv
: >"$faults"
n_faults=0
t_window=$SECONDS
fired=" "
all_fired() { local k; for k in $kinds; do [[ "$fired" == *" $k "* ]] || return 1; done; }
# The window stays open until every kind fired once (a fast run would otherwise skip one).
while [ -n "${kinds// /}" ] && { [ $((SECONDS - t_window)) -lt "$secs" ] || ! all_fired; }; do
  fill_round
  kind=${round[0]}
  round=("${round[@]:1}")
  s0=$(status_step)
  # Confined, a shrink/grow takes ~20 s: a grow that meets the job's last step wedges it (docs/elastic.md).
  margin=$([ -n "$confine" ] && echo 150 || echo 40)
  ! phase_is Succeeded && [ "$s0" -lt $((steps - margin)) ] || { echo "chaos: the job is near its end (step $s0): no more faults"; break; }
  g0=$(gen_now)
  idx=$(rng 2)
  # Confined, a node fault takes pod 1's node: the world shrinks to pod 0, whose log the analysis reads as rank 0.
  [ -z "$confine" ] || [ "$kind" != node ] || idx=1
  pod=$job_name-worker-$idx
  target=$pod
  restores0=$(grep -c 'checkpoint: restored ' "$(pod_log "$job_name-worker-0")" || true)
  uid0=$(pod_uid "$pod")
  # t: the moment of the fault itself (looking up a pid or node first can take a while on a busy machine).
  case "$kind" in
    kill)
      pid=$(trainer_pid "$pod")
      [ -n "$pid" ] || fail "no trainer in $pod to kill"
      t=$(ts_now)
      kill -9 "$pid"
      ;;
    pod)
      t=$(ts_now)
      kubectl delete pod "$pod" -n "$ns" --wait=false >/dev/null
      ;;
    hang)
      pid=$(trainer_pid "$pod")
      [ -n "$pid" ] || fail "no trainer in $pod to stop"
      t=$(ts_now)
      kill -STOP "$pid"
      stopped_pids+=("$pid")
      ;;
    node)
      target=$(pod_node "$pod")
      [ -n "$target" ] || fail "$pod has no node"
      t=$(ts_now)
      agent_ctl node-down "$target" >/dev/null
      nodes_down+=("$target")
      ;;
    operator)
      target=operator
      t=$(ts_now)
      kill_operator
      sleep "$(python3 -c "print(0.5 + $(rng 250) / 100)")"
      restart_operator
      ;;
  esac
  n_faults=$((n_faults + 1))
  fired="$fired$kind "
  printf '%s\t%s\t%s\t%s\t%s\n' "$t" "$kind" "$target" "$g0" "$s0" >>"$faults"
  echo "chaos: fault $n_faults: $kind $target at step $s0, generation $g0 ($(date -u +%T.%N | cut -c1-12))"
  if [ "$kind" = node ]; then
    # Until the lost node is dealt with (the pod replaced on another node, or the world shrunk), not just until the
    # survivor's exit restarted the same pods: node-up before that would turn the fault into a process kill.
    if [ -n "$confine" ]; then
      wait_for 120 "the world to shrink after the node loss" world_is 1
    else
      replaced() { u=$(pod_uid "$pod") && [ -n "$u" ] && [ "$u" != "$uid0" ] && n=$(pod_node "$pod") && [ -n "$n" ] && [ "$n" != "$target" ]; }
      wait_for 120 "$pod to be replaced on another node" replaced
    fi
  fi
  if [ "$kind" != operator ]; then
    wait_for 120 "a new generation after the $kind fault" bash -c "[ \"\$(kubectl get tj $job_name -n $ns -o jsonpath='{.status.generation}')\" -gt $g0 ]"
    # Rank 0 restored again (its log's steps before that are the old generation's).
    wait_for 120 "rank 0 to restore after the $kind fault" bash -c "[ \$(grep -c 'checkpoint: restored ' '$(pod_log "$job_name-worker-0")') -gt $restores0 ]"
  fi
  gap=$((5 + $(rng 8)))
  wait_for 180 "the job to train again after the $kind fault" running_again $((s0 + 3))
  if [ "$kind" = node ]; then
    printf '%s\t%s\n' "$n_faults" "$(ts_now)" >>"$work/node_up.tsv"
    agent_ctl node-up "$target" >/dev/null
    nodes_down=()
    # Confined (shrink/grow): the world grows back to 2 before the next fault.
    [ -z "$confine" ] || wait_for 120 "the world to grow back to 2" world_is 2
  fi
  if [ "$kind" = operator ]; then
    [ "$(gen_now)" = "$g0" ] || fail "the operator restart opened generation $(gen_now) (was $g0): a restart without a failure"
  fi
  if [ -n "$gap_secs" ]; then # a fault every gap_secs seconds, counted from this one
    sleep "$(python3 -c "print(max(0.0, $t + $gap_secs - $(ts_now)))")"
  else
    wait_for 180 "the job to train $gap more steps" running_again $((s0 + gap))
  fi
done
echo "chaos: $n_faults faults in $((SECONDS - t_window)) s; waiting for the job to finish"
all_fired || fail "the job neared its end before every kind fired (fired:$fired; kinds: $kinds): raise RAILYARD_CHAOS_STEPS"
wait_succeeded 600
t_done=$(ts_now)
kill -0 "$op_pid" 2>/dev/null || fail "the operator exited"
[ "$(jp '{.status.progress}')" = "$steps/$steps" ] || fail "progress '$(jp '{.status.progress}')'"
restarts=$(jp '{.status.restarts}')
gens=$(jp '{.status.generation}')
if [ -z "$confine" ]; then
  [ "$restarts" = $((gens - 1)) ] || fail "restarts $restarts but generation $gens: a restart lost or counted twice"
else # a grow opens a generation without being a restart
  [ "$restarts" -le $((gens - 1)) ] || fail "restarts $restarts but generation $gens: a restart counted twice"
fi
hard=$(cut -f2 "$faults" | grep -vc '^operator$' || true)
[ "$restarts" -ge "$hard" ] || fail "restarts $restarts < $hard kill/pod/node faults"
# At most 2 per fault (see the header; expected 1 since the replacement rule); confined, node-up grows the world.
per_fault=$([ -n "$confine" ] && echo 3 || echo 2)
[ "$restarts" -le $((per_fault * hard)) ] || fail "restarts $restarts > $per_fault x the $hard kill/pod/node faults"
last=$(steps_of "$job_name-worker-0" | tail -1)
[ "${last%% *}" = "$steps" ] || fail "rank 0's last step is '$last', want $steps"
if [ -z "${RAILYARD_CHAOS_NO_REFERENCE:-}" ]; then # the benchmark measures times only
  ref_loss=$(reference_params_dp2 "$steps")
  [ "${last#* }" = "$ref_loss" ] || fail "final loss ${last#* } differs from the undisturbed run's $ref_loss"
  params_sha=$(final_params_match "$steps")
else
  params_sha="(not compared)"
fi

# The goodput ledger (status.goodput) through every fault kind and the operator's kill -9 restarts: stopped at
# Succeeded, its causes summing to its wall time, which is the job's whole life (creation to the Succeeded write:
# nothing lost while the operator was down); the faults' detection, the new worlds' scheduling and start-up charged.
python3 - "$(kubectl get tj "$job_name" -n "$ns" -o json)" "$hard" <<'PY' || fail "status.goodput: $(jp '{.status.goodput}')"
import json, sys
from datetime import datetime
tj = json.loads(sys.argv[1])
g = tj["status"]["goodput"]
secs = g["seconds"]
def t(s): return datetime.strptime(s.replace("Z", "+00:00"), "%Y-%m-%dT%H:%M:%S.%f%z" if "." in s else "%Y-%m-%dT%H:%M:%S%z")
life = (t(g["since"]) - t(tj["metadata"]["creationTimestamp"])).total_seconds()
print("chaos: goodput ledger " + json.dumps(secs) + " wall %.1f s, ratio %s" % (g["wallSeconds"], g.get("ratio")))
bad = []
if g["state"] != "ended": bad.append("state %r" % g["state"])
if abs(sum(secs.values()) - g["wallSeconds"]) > 0.02: bad.append("causes sum to %.3f, wall %.3f" % (sum(secs.values()), g["wallSeconds"]))
if not (life - 0.1 <= g["wallSeconds"] <= life + 1.1): bad.append("wall %.3f, life %.3f" % (g["wallSeconds"], life))
# Detection only when something failed (the benchmark's baseline runs the job undisturbed).
charged = ("training", "scheduling", "rendezvousAndInit") + (("detection",) if int(sys.argv[2]) > 0 else ())
bad += [c + " is 0" for c in charged if secs[c] <= 0]
if not (0 < g.get("ratio", 0) < 1): bad.append("ratio %r" % g.get("ratio"))
for b in bad: print("  " + b, file=sys.stderr)
sys.exit(1 if bad else 0)
PY

# Per fault, from the pods' logs (timestamps in ms): detection = the first "generation superseded"/"joined
# generation" line of either agent after the fault; recovery = the first step rank 0 completed after its next restore;
# steps lost = the last step rank 0 reported before that restore minus the restored step.
result=${RAILYARD_CHAOS_RESULT:-${RAILYARD_RESULTS_DIR:+$RAILYARD_RESULTS_DIR/elastic_chaos.json}}
python3 - "$faults" "$(pod_log "$job_name-worker-0")" "$(pod_log "$job_name-worker-1")" "$work/op.log" \
  "$seed" "$steps" "$restarts" "$gens" "${last#* }" "$secs" "$t_done" "${result:-}" "$confine" "$work/node_up.tsv" \
  "${RAILYARD_CHAOS_NO_REFERENCE:-}" <<'PY' || fail "per-fault check failed (above)"
import calendar, json, os, re, statistics, sys, time
faults_f, log0_f, log1_f, op_f, seed, steps, restarts, gens, loss, secs, t_done, out, confine, up_f, noref = sys.argv[1:]
node_up = {int(a): float(b) for a, b in (l.split("\t") for l in open(up_f).read().splitlines())} if os.path.exists(up_f) else {}
def ts(line):
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d{3})Z", line)
    return calendar.timegm(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S")) + int(m.group(2)) / 1000 if m else None
def lines(p):
    return [(ts(l), l) for l in open(p, errors="replace").read().splitlines() if ts(l) is not None]
log0, log1, oplog = lines(log0_f), lines(log1_f), lines(op_f)
faults = [l.split("\t") for l in open(faults_f).read().splitlines()]
step_re = re.compile(r"worker: step step=(\d+)/")
commit_re = re.compile(r"ckpt: committed step=(\d+)")
# Step times of undisturbed stretches (consecutive steps of one generation) for goodput.
intervals, prev = [], None
for t, l in log0:
    m = step_re.search(l)
    if "checkpoint: restored " in l or "agent: joined" in l:
        prev = None
    if m:
        s = int(m.group(1))
        if prev and s == prev[1] + 1:
            intervals.append(t - prev[0])
        prev = (t, s)
first_step = next(t for t, l in log0 if step_re.search(l))
events, bad = [], []
names = {"kill": "trainer kill -9", "hang": "trainer SIGSTOP (found by its agent)", "pod": "pod delete", "node": "node down (shrink/grow)" if confine else "node down",
         "operator": "operator kill -9 + restart"}
for i, (t, kind, target, g0, s0) in enumerate(faults):
    t = float(t)
    s0 = max([int(m.group(1)) for lt, l in log0 if lt < t for m in [step_re.search(l)] if m] or [0])
    end = float(faults[i + 1][0]) if i + 1 < len(faults) else float(t_done)
    ev = {"kind": kind, "target": target, "time": t, "step_at_fault": int(s0)}
    if kind == "operator":
        back = next((lt for lt, l in oplog if lt > t and "leading: reconciling" in l), None)
        nxt = next((lt for lt, l in log0 if lt > (back or t) and step_re.search(l)), None)
        # Training goes on while the operator is away: "recovery" is until the new operator leads.
        ev.update(detect_s=None, recovery_s=round(back - t, 2) if back else None, steps_lost=0,
                  next_step_after_back_s=round(nxt - t, 2) if nxt else None)
        events.append(ev)
        continue
    det = min((lt for lt, l in log0 + log1 if t < lt < end and ("generation superseded" in l or "agent: joined generation=" in l)),
              default=None)
    ri = next((j for j, (lt, l) in enumerate(log0) if t < lt < end and "checkpoint: restored " in l), None)
    if ri is None:
        bad.append(f"fault {i + 1} ({kind}): rank 0 did not restore before the next fault")
        continue
    r = int(re.search(r" step=(\d+)", log0[ri][1]).group(1))
    src = re.search(r" from=(\S+)", log0[ri][1]).group(1)
    before = [int(m.group(1)) for _, l in log0[:ri] for m in [step_re.search(l)] if m]
    reached = before[-1] if before else 0
    nxt = next((lt for lt, l in log0[ri:] if step_re.search(l)), None)
    lost = max(0, reached - r)
    if kind == "node" and confine and (i + 1) in node_up:
        # The grow after node-up: its own restore, recovery timed from node-up.
        up = node_up[i + 1]
        gi = next((j for j, (lt, l) in enumerate(log0) if up < lt < end and "checkpoint: restored " in l), None)
        if gi is not None:
            gr = int(re.search(r" step=(\d+)", log0[gi][1]).group(1))
            gb = [int(m.group(1)) for _, l in log0[:gi] for m in [step_re.search(l)] if m]
            gn = next((lt for lt, l in log0[gi:] if step_re.search(l)), None)
            ev.update(grow_recovery_s=round(gn - up, 2) if gn else None, grow_steps_lost=max(0, (gb[-1] if gb else 0) - gr))
    ev.update(detect_s=round(det - t, 2) if det else None, recovery_s=round(nxt - t, 2) if nxt else None,
              steps_lost=lost, restored=r, restored_from="memory" if src == "memory" else "disk", reached=reached)
    events.append(ev)
    limit = {"kill": 0, "hang": 1}.get(kind, 5)
    if src not in ("memory", "peer"):
        # A disk restore can only be as new as the newest step rank 0 had committed ("ckpt: committed"); the save
        # of the step after it may still have been persisting when the node died (its rank's shard never
        # written), so the bound is the interval plus the steps that save was in flight, not the interval alone.
        committed = max([int(m.group(1)) for _, l in log0[:ri] for m in [commit_re.search(l)] if m] or [0])
        ev["committed_at_restore"] = committed
        if r < committed:
            bad.append(f"fault {i + 1} ({kind} {target}): restored {r} from disk but step {committed} was committed")
        limit = max(limit, reached - committed)
    if lost > limit:
        bad.append(f"fault {i + 1} ({kind} {target}): {lost} steps lost (reached {reached}, restored {r} from {src}), want <= {limit}")
for e in events:
    print(f"  {e['kind']:8} {e['target']:24} step {e['step_at_fault']:4}: detect {e['detect_s']} s, first new step "
          f"{e['recovery_s']} s, steps lost {e['steps_lost']}" + (f" (restored {e['restored']} from {e['restored_from']})" if "restored" in e else ""))
wall = float(t_done) - first_step
step_s = statistics.median(intervals) if intervals else None
goodput = int(steps) * step_s / wall if step_s else None
by_kind = []
for k in ["kill", "hang", "pod", "node", "operator"]:
    ev = [e for e in events if e["kind"] == k]
    if not ev:
        continue
    rec = [e["recovery_s"] for e in ev if e["recovery_s"] is not None]
    det = [e["detect_s"] for e in ev if e["detect_s"] is not None]
    by_kind.append({"kind": names[k], "count": len(ev),
                    "detect_s_median": round(statistics.median(det), 2) if det else None,
                    "recovery_s_median": round(statistics.median(rec), 2) if rec else None,
                    "recovery_s_max": round(max(rec), 2) if rec else None,
                    "steps_lost_max": max(e["steps_lost"] for e in ev),
                    "steps_lost_total": sum(e["steps_lost"] for e in ev)})
res = {"test": "e2e_elastic_chaos", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "passed": not bad,
       "seed": int(seed), "window_s": int(secs), "steps": int(steps), "faults": by_kind, "events": events,
       "restarts": int(restarts), "generations": int(gens), "final_loss": float(loss), "final_loss_equal": not noref,
       "params_bitwise_equal": not noref, "step_s_median": round(step_s, 4) if step_s else None,
       "wall_s": round(wall, 1), "goodput": round(goodput, 3) if goodput else None, "confine": confine or None}
print(f"chaos: {len(events)} faults, restarts {restarts}, generations {gens}; median step {res['step_s_median']} s; "
      f"first step -> Succeeded {res['wall_s']} s; goodput {res['goodput']}")
for b in bad:
    print("FAIL: " + b, file=sys.stderr)
if out:
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    json.dump(res, open(out + ".tmp", "w"), indent=1)
    os.replace(out + ".tmp", out)
sys.exit(1 if bad else 0)
PY
echo "chaos e2e: ok in $((SECONDS - t_start)) s (seed $seed, $n_faults faults, restarts $restarts, final loss ${last#* } = the undisturbed run's, final parameters bitwise equal, sha256 ${params_sha:0:16})"
