#!/usr/bin/env bash
# E2E: a job that brings its own program (issue #25), on real nodes. deploy/examples/pytorch-ddp.yaml as shipped
# (a small GPT in plain PyTorch with DDP over gloo, in localhost/railyard/pytorch-example: Debian's python3-torch and
# the script, no Railyard binary) on a cluster of its own with 3 real nodes, the operator on the host and
# railyard-monitor watching: in flows A and B through a real Prometheus (cluster.sh up --prometheus) that scrapes every
# rank's metrics port of the real pods, in C in embedded mode (the monitor scrapes the ports itself); either way the
# program's agent serves the ranks' series from their progress files and /proc. Three jobs, each carrying as many
# flows as can share it (one job per flow took 16-17 minutes; issue #39):
#   A. a Kubeflow PyTorchJob (tests/e2e/real/pytorchjob.yaml) converted by `railyard convert`: torchrun mode (the
#      command `torchrun --monitor_interval=0.2 /app/train_gpt.py`, its --nnodes dropped), a straggler (--straggle-rank 1 --straggle-factor 4
#      --straggle-generation 1: rank 1's own work 4 times as long per step in generation 1, a ratio that holds on a busy
#      host, where a fixed 0.1 s did not; the script reports compute_seconds to its progress file): the straggler rule names rank 1
#      from the compute time per step the agent serves, and the job restarts; torchrun got the world in PET_*, the rank
#      is its child; kill -9 of that rank -> the failure names rank 1 with torchrun's line, one in-place restart; the
#      rest without the monitor, to the reference run's final loss (the same script, started per rank by hand);
#   B. the script reporting no progress (--no-progress), hangTimeoutSeconds 20: SIGSTOP of rank 1's python -> its
#      agent sees the process stopped -> the stopped rule's Hang naming rank 1 within seconds (not hangTimeoutSeconds)
#      -> restart, resumed; then a live `kubectl scale --replicas 3`:
#      the next generation has WORLD_SIZE 3 (a third pod on the third node; its hostfile names the three pods), the
#      script resumes from its checkpoint in the world of 3 and the job Succeeds;
#   C. the example as shipped (a slower step; excludeFailedNodes false), one job through three faults, and its final loss equals that of the
#      same script run undisturbed on the host by two local processes (same Debian PyTorch: stated tolerance 1e-4, the
#      runs agree to the printed digits; a resumed run sees the same data from the restored step on):
#      1. the image holds no railyard-worker; the pod's launcher init container copies the agent in, and each rank
#         runs with torchrun's environment (RANK, WORLD_SIZE, ..., TORCHELASTIC_RUN_ID) and a writable HOME with its
#         caches (HOME, XDG_CACHE_HOME, HF_HOME, ...); stable names: MASTER_ADDR is pod 0's DNS name through the
#         job's headless Service (every fault below trains through it), RAILYARD_HOSTFILE names both pods, and the
#         names resolve in the pods to their IPs on the local cluster's DNS; the pods pass the restricted
#         profile; no restart request while it trains; the metrics port serves the ranks' series;
#      2. kill -9 of rank 1's python: the generation restarts in place (same pods), the script resumes from its own
#         checkpoint losing at most the checkpoint interval (20 steps);
#      3. SIGSTOP of rank 1's python -> the stall rule requests a restart (Hang; this monitor runs with
#         --stopped-seconds 0 --idle-seconds 0, so the step-based rule stays covered) -> the generation restarts in place,
#         the script resumes losing at most the interval;
#      4. a lost node (`cluster.sh stop-node` of rank 1's node, the monitor stopped first): the pod is replaced on
#         another node, the script resumes from its checkpoint and the job Succeeds, progress 300/300.
#   (Flows A-C run the example on the shared claim railyard-shared in place of a volume of its own: the flows' jobs
#   share it, each with an empty checkpoint directory of its name, emptied on the host before it starts.)
#   (deploy/examples/pytorch-ddp.yaml exactly as shipped, its own volume and all, runs under the chart's operator in
#   tests/e2e/real/install_test.sh section 6.)
set -euo pipefail
# shellcheck source=../lib/real_env.sh
source "${RAILYARD_SOURCE_DIR:?}/tests/e2e/lib/real_env.sh" program-e2e
job=pytorch-ddp-a # each flow its own job: pytorch-ddp-a, -b, -c (apply_job)
op_pid=""
mon_pid=""
targets_pid=""
fail() {
  echo "FAIL: $*" >&2
  kubectl get tj,pods -n "$ns" -o wide >&2 || true
  kubectl get tj "$job" -n "$ns" -o jsonpath='{.status.conditions}' >&2 2>/dev/null || true
  kubectl get events -n "$ns" --sort-by=.lastTimestamp 2>/dev/null | tail -15 >&2 || true
  tail -n 30 "$work/op.log" >&2 || true
  [ -z "$mon_pid" ] || tail -n 15 "$work/mon.log" >&2 || true
  for f in "$state"/logs/ry-real-*.log; do # the kubelets' view of the job's pods (a pod stuck Terminating)
    echo "== $f" >&2
    grep -a "$job-worker" "$f" | tail -n 8 >&2 || true
  done
  for p in $(kubectl get pods -n "$ns" -o name 2>/dev/null); do
    echo "== $p" >&2
    kubectl logs -n "$ns" "$p" --tail 10 >&2 || true
  done
  exit 1
}
ref_pids=()
cleanup() {
  for p in "${ref_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -n "$op_pid" ] && kill "$op_pid" 2>/dev/null && wait "$op_pid" 2>/dev/null || true
  [ -n "$mon_pid" ] && kill "$mon_pid" 2>/dev/null && wait "$mon_pid" 2>/dev/null || true
  [ -n "$targets_pid" ] && kill "$targets_pid" 2>/dev/null && wait "$targets_pid" 2>/dev/null || true
  bash "$cluster" down --state-dir "$state" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
# shellcheck source=../operator/lib.sh
source "$src/tests/e2e/operator/lib.sh"

# Reference: the same script, two local processes on the host (Debian's python3-torch, as in the image), run while the
# cluster comes up (which mostly waits); its final loss is read before the first comparison.
ref_dir="$work/ref"
mkdir -p "$ref_dir"
port=$(free_port)
ref_pids=()
for r in 0 1; do
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r RAILYARD_CHECKPOINT_DIR="$ref_dir/ckpt" \
    RAILYARD_TOTAL_STEPS=300 RAILYARD_CHECKPOINT_INTERVAL_STEPS=20 \
    /usr/bin/python3 "$src/deploy/examples/pytorch/train_gpt.py" \
    >"$ref_dir/rank$r.log" 2>&1 &
  ref_pids+=("$!")
done

bash "$cluster" down --state-dir "$state" >/dev/null 2>&1 || true
t0=$SECONDS
bash "$cluster" up --state-dir "$state" --real-nodes 3 --prometheus >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; fail "cluster up"; }
eval "$(bash "$cluster" env --state-dir "$state")"
[ -n "${PROMETHEUS_URL:-}" ] || fail "cluster up --prometheus: no PROMETHEUS_URL"
# The example's image (its python3-torch base is built once and cached, about 3 minutes cold).
socks=()
for d in "$state"/real/ry-real-*/run/containerd.sock; do socks+=(--load "$d"); done
bash "$src/deploy/images/build.sh" --build-dir "$(dirname "$bin")" --examples "${socks[@]}" >"$work/images.log" 2>&1 ||
  { tail -5 "$work/images.log" >&2; fail "building the example image"; }
log "cluster with 3 real nodes and the example image up in $((SECONDS - t0)) s"
install_crd "$src"
shared=$(bash "$cluster" share "$ns" --state-dir "$state")
start_host_operator
# Flows A and B watch through a real Prometheus scraping every rank's port of the real pods: the target list is the
# pods' metrics ports with their metadata (prometheus.sh pod-targets, what kubernetes_sd_configs does in a cluster;
# Debian's Prometheus has none), rewritten every second.
(while :; do
  bash "$src/deploy/local/lib/prometheus.sh" pod-targets "$state" workers "$ns" >/dev/null 2>&1 || true
  sleep 1
done) &
targets_pid=$!
jp() { kubectl get tj "$job" -n "$ns" -o jsonpath="$1" 2>/dev/null; }
wait_phase() { # phase seconds
  local t=$SECONDS p
  while :; do
    p=$(jp '{.status.phase}')
    [ "$p" = "$1" ] && return 0
    case "$p" in Failed | Invalid) fail "$job ended $p: $(jp '{.status.conditions}')" ;; esac
    [ $((SECONDS - t)) -lt "$2" ] || fail "$job not $1 after $2 s (phase '$p')"
    sleep 0.5
  done
}
step() { local s; s=$(jp '{.status.step}'); echo "${s:-0}"; }
# apply_job [SLEEP [HANG_TIMEOUT [ARG...]]]: the example as shipped; with SLEEP, --step-sleep SLEEP appended (a
# slower run to hit mid-way); with HANG_TIMEOUT, failurePolicy.hangTimeoutSeconds; ARGs appended to the script's;
# with KEEP_NODES=1 in the environment, failurePolicy.excludeFailedNodes false; with AGENT_HANG=off, the agent's own
# hang watch off (RAILYARD_HANG_*_SECONDS=0 in the pod template); with CONVERT=1, the job is
# tests/e2e/real/pytorchjob.yaml (a Kubeflow PyTorchJob whose command is torchrun) through `railyard convert`, with
# the example's checkpoint section and step count (torchrun mode: one torchrun per pod starts the rank).
# The flows need 2 of the 3 nodes free of worker pods: the previous flow's pods end a moment after its job Succeeded
# or was deleted (their agents exit, the kubelets report). A job applied before that had its gang placed 1 of 2 and
# grown to 2 (generation 2), which the flows' checks take for a restart (seen 2026-12-07, twice, before B and C).
pods_ended() { [ -z "$(kubectl get pods -n "$ns" -l railyard.dev/job="$1" --field-selector=status.phase=Running -o name)" ]; }
apply_job() {
  # Each flow's job has a name of its own (pytorch-ddp-a, -b, -c; set in $job by the caller) and its own checkpoint
  # path: the previous job is deleted and its pods are left to the garbage collector and the kubelets, without waiting.
  # (Reusing one name meant waiting for the old pods to go first; the kubelet here, v1.20.2, sometimes never finishes
  # deleting a pod (kubernetes#97288), which cost up to 30 s per flow and a force-delete.)
  if [ -n "${prev_job:-}" ] && [ "$prev_job" != "$job" ]; then
    kubectl delete tj "$prev_job" -n "$ns" --wait=false >/dev/null 2>&1 || true
  fi
  prev_job=$job
  rm -rf "$shared/checkpoints/$job"
  if [ "${CONVERT:-0}" = 1 ]; then # flow A: the PyTorchJob converted, as a user coming from Kubeflow would
    "$bin/railyard" convert "$src/tests/e2e/real/pytorchjob.yaml" >"$work/converted.yaml" 2>"$work/convert.err" ||
      fail "railyard convert: $(cat "$work/convert.err")"
  fi
  # The example on the shared claim in place of a volume of its own (its checkpoint directory emptied above).
  JOB=$job python3 - <(python3 "$src/tests/e2e/lib/example_on_claim.py" "$src/deploy/examples/pytorch-ddp.yaml" railyard-shared) \
    "$@" >"$work/job.yaml" <<'PY'
import os, sys, yaml
j = yaml.safe_load(open(sys.argv[1]))
if os.environ.get("CONVERT") == "1":
    # The converted PyTorchJob as it came out (image, torchrun command and launcher, replicas, procs, restarts,
    # template), plus what a PyTorchJob has no field for: Railyard's checkpoint section (flash checkpoints) and the
    # step count the status shows.
    c = yaml.safe_load(open(os.path.join(os.environ["work"], "converted.yaml")))
    assert c["spec"]["program"]["command"] == ["torchrun", "--monitor_interval=0.2", "/app/train_gpt.py"], c["spec"]
    assert c["spec"]["program"]["launcher"] == "torchrun" and c["spec"]["replicas"] == 2, c["spec"]
    c["spec"]["checkpoint"] = j["spec"]["checkpoint"]
    c["spec"]["program"]["totalSteps"] = j["spec"]["program"]["totalSteps"]
    j = c
j["metadata"]["name"] = os.environ["JOB"]
j["spec"]["checkpoint"]["path"] = "/shared/checkpoints/" + os.environ["JOB"]
if len(sys.argv) > 2:
    j["spec"]["program"]["args"] = ["--step-sleep", sys.argv[2]] + sys.argv[4:]
if len(sys.argv) > 3:
    j["spec"]["failurePolicy"]["hangTimeoutSeconds"] = int(sys.argv[3])
if os.environ.get("KEEP_NODES") == "1":
    j["spec"]["failurePolicy"]["excludeFailedNodes"] = False
if os.environ.get("AGENT_HANG") == "off":
    # The monitor's rules are under test: the agent's own hang watch (a stopped rank in about 1 s) is off.
    c = j["spec"].setdefault("template", {}).setdefault("spec", {}).setdefault("containers", [{}])
    c[0].setdefault("env", []).extend([{"name": "RAILYARD_HANG_STOPPED_SECONDS", "value": "0"},
                                       {"name": "RAILYARD_HANG_STALL_SECONDS", "value": "0"}])
print(yaml.safe_dump(j))
PY
  kubectl apply -n "$ns" -f "$work/job.yaml" >/dev/null
}
# signal_rank POD SIGNAL: sends SIGNAL to the pod's python rank.
signal_rank() {
  kubectl exec "$1" -n "$ns" -- python3 -c '
import os, signal, sys
for p in os.listdir("/proc"):
    c = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0") if p.isdigit() and int(p) != os.getpid() else []
    # python3 /app/train_gpt.py (per rank), python3 -u /app/train_gpt.py (started by torchrun; never torchrun itself)
    if c[1:2] == [b"/app/train_gpt.py"] or c[1:3] == [b"-u", b"/app/train_gpt.py"]:
        print("signalled", p, flush=True); os.kill(int(p), getattr(signal, sys.argv[1]))' "$2" | grep -q signalled ||
    fail "no python rank to signal in $1"
}
annotation() { kubectl get tj "$job" -n "$ns" -o jsonpath='{.metadata.annotations.railyard\.dev/restart-request}'; }
# Python that leaves in `env` the environment of the pod's per-rank python (python3 /app/train_gpt.py); a check
# appended to it runs in the pod (kubectl exec ... python3 -c "$rank_env_py"'CHECK').
rank_env_py='
import os
env = {}
for p in os.listdir("/proc"):
    if p.isdigit() and int(p) != os.getpid():
        try:
            if open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")[1:2] == [b"/app/train_gpt.py"]:
                env = dict(l.split("=", 1) for l in open(f"/proc/{p}/environ", "rb").read().decode().split("\0") if "=" in l)
        except OSError:
            pass
'
# names_check POD N [RESOLVE]: stable names (issue 41) as POD's python rank sees them in a world of N pods: MASTER_ADDR
# is pod 0's DNS name, RAILYARD_HOSTFILE lists the N pods by name in rank order, and (unless RESOLVE is 0) each name
# resolves in the pod (getent: the pod's resolv.conf, the cluster DNS) to that pod's IP.
names_check() {
  local dom="$job.$ns.svc.cluster.local" want="" i ip got
  for ((i = 0; i < $2; i++)); do want+="$job-worker-$i.$dom slots=1"$'\n'; done
  kubectl exec "$1" -n "$ns" -- python3 -c "$rank_env_py"'
import sys
assert env.get("MASTER_ADDR") == sys.argv[1], env.get("MASTER_ADDR")
sys.stdout.write(open(env["RAILYARD_HOSTFILE"]).read())' "$job-worker-0.$dom" >"$work/hostfile" 2>"$work/names.err" ||
    fail "$1: MASTER_ADDR or the hostfile: $(tail -2 "$work/names.err")"
  [ "$(cat "$work/hostfile")"$'\n' = "$want" ] || fail "$1: hostfile $(cat "$work/hostfile"), want $want"
  [ "${3:-1}" = 0 ] && return 0
  for ((i = 0; i < $2; i++)); do
    ip=$(kubectl get pod "$job-worker-$i" -n "$ns" -o jsonpath='{.status.podIP}')
    got=$(kubectl exec "$1" -n "$ns" -- getent hosts "$job-worker-$i.$dom" 2>/dev/null | cut -d' ' -f1 || true)
    [ "$got" = "$ip" ] || fail "$1 resolves $job-worker-$i.$dom to '$got', want its IP $ip"
  done
}
# The job's status.loss: rank 0's last progress report (the mean over the ranks). Not the pod's log: a finished job's
# pods that still run (the agent exiting) are deleted (cleanPodPolicy Running), so the log may be gone already.
final_loss() { jp '{.status.loss}'; }

close() { python3 -c "import sys; sys.exit(0 if abs(float('$1') - float('$2')) <= 1e-4 else 1)"; }
steps_logged() { # POD: the last "step N/" rank 0 printed (the only progress a --no-progress run shows)
  kubectl logs "$1" -n "$ns" 2>/dev/null | sed -n 's|^step \([0-9]*\)/.*|\1|p' | tail -1
}
resumed_at() { # POD: the step the script resumed from in this pod's log (the last resume)
  kubectl logs "$1" -n "$ns" | sed -n 's|^resumed from .* at step \([0-9]*\) .*|\1|p' | tail -1
}
generation() { jp '{.status.generation}'; }
flash_lines() { # what both ranks' flash checkpoints said (restores), for a failure message
  for p in "$job-worker-0" "$job-worker-1"; do
    echo "$p: $(kubectl logs "$p" -n "$ns" 2>/dev/null | grep -E '^resumed from|railyard_flash' | tr '\n' ';')"
  done
}
evidence() { annotation | python3 -c 'import json,sys; print(json.load(sys.stdin)["evidence"])'; }

# The monitor watches every job of the test from the start (a restart request before a failure fails the test);
# it is stopped before the node loss, which is the operator's to handle.
"$bin/railyard-monitor" --namespace "$ns" --listen 127.0.0.1:0 --interval 1 --straggler-window 10 \
  --prometheus-url "$PROMETHEUS_URL" >"$work/mon.log" 2>&1 &
mon_pid=$!

# --- A. a straggler ------------------------------------------------------------------------------------------
t0=$SECONDS
job=pytorch-ddp-a
CONVERT=1 work=$work apply_job 0.02 60 --straggle-rank 1 --straggle-factor 4 --straggle-generation 1
grep -q 'railyard.dev/converted-from' <<<"$(kubectl get tj "$job" -n "$ns" -o jsonpath='{.metadata.annotations}')" ||
  fail "flow A's job is not the converted PyTorchJob"
wait_for 120 "the monitor's restart request" sh -c "kubectl get tj $job -n $ns -o jsonpath='{.metadata.annotations}' | grep -q restart-request"
grep -q '"rule":"straggler"' <<<"$(annotation)" || fail "restart request: $(annotation)"
grep -q '"rank":1,' <<<"$(annotation)" || fail "the straggler request names another rank: $(annotation)"
# The restart completes: generation 2 with every pod running (rank 1's replacement on a node not excluded).
wait_for 120 "generation 2 running" sh -c "[ \"\$(kubectl get tj $job -n $ns -o jsonpath='{.status.generation}/{.status.phase}')\" = 2/Running ]"
log "A. straggler (through Prometheus): $(evidence), $((SECONDS - t0)) s after the job was created"
kill "$mon_pid" 2>/dev/null && wait "$mon_pid" 2>/dev/null || true # the rest of A is the agents' and the operator's
mon_pid=""
# Flow A runs in torchrun mode: in each pod the agent started torchrun with the world in PET_*, and torchrun the rank.
tr_check='
import os
def cmd(p): return open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")
def env(p): return dict(l.split("=", 1) for l in open(f"/proc/{p}/environ", "rb").read().decode().split("\0") if "=" in l)
pids = [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
tr = [p for p in pids if b"/usr/local/bin/torchrun" in cmd(p)]
rk = [p for p in pids if cmd(p)[1:3] == [b"-u", b"/app/train_gpt.py"]]
assert len(tr) == 1 and len(rk) == 1, (tr, rk)
t, r = env(tr[0]), env(rk[0])
assert (t["PET_NNODES"], t["PET_NPROC_PER_NODE"], t["PET_NODE_RANK"], t["PET_MAX_RESTARTS"]) == ("2", "1", "1", "0"), t
assert (r["RANK"], r["WORLD_SIZE"], r["GROUP_RANK"]) == ("1", "2", "1"), r
assert "RAILYARD_PROGRESS_FILE" not in r and r["RAILYARD_PROGRESS_DIR"], r
assert open(f"/proc/{rk[0]}/stat").read().rsplit(")", 1)[1].split()[1] == tr[0]  # torchrun is its parent
'
tr_ok=0
for _ in $(seq 60); do # generation 2's torchrun and rank may still be starting
  kubectl exec "$job-worker-1" -n "$ns" -- python3 -c "$tr_check" 2>"$work/tr.err" && { tr_ok=1; break; }
  sleep 1
done
[ "$tr_ok" = 1 ] || fail "torchrun mode in $job-worker-1: $(tail -2 "$work/tr.err")"
# kill -9 of the rank torchrun started: torchrun reports it, the agent names the rank at once, one in-place restart;
# the ranks resume from their flash checkpoints in memory, at or after the last step the job reported (0 lost).
# Rank 0 of generation 2 resumed and printed 5 steps since (its log, not status.step, which may still hold generation
# 1's last report); the last step it printed was saved first (the example saves, then reports).
wait_for 90 "generation 2 training" sh -c "kubectl logs $job-worker-0 -n $ns | awk '/^resumed from/ {r = 1; n = 0} r && /^step [0-9]+\\// {n++} END {exit !(r && n >= 5)}'"
resumes=$(grep -c '^resumed from' <<<"$(kubectl logs "$job-worker-0" -n "$ns")" || true)
reported=$(steps_logged "$job-worker-0")
signal_rank "$job-worker-1" SIGKILL
wait_for 60 "generation 3" sh -c "[ \"\$(kubectl get tj $job -n $ns -o jsonpath='{.status.generation}')\" -ge 3 ]"
grep -q 'exitcode: -9' <<<"$(jp '{.status.lastRestart.message}')" ||
  fail "the failed rank's report lacks torchrun's line: $(jp '{.status.lastRestart}')"
[ "$(jp '{.status.lastRestart.rank}')" = 1 ] || fail "the restart names another rank: $(jp '{.status.lastRestart}')"
wait_for 60 "generation 3 running" sh -c "[ \"\$(kubectl get tj $job -n $ns -o jsonpath='{.status.phase}')\" = Running ]"
wait_for 60 "the script resuming in generation 3" sh -c "[ \"\$(kubectl logs $job-worker-0 -n $ns | grep -c '^resumed from')\" -gt $resumes ]"
flash=$(kubectl logs "$job-worker-0" -n "$ns" | grep '^resumed from' | tail -1)
grep -q '^resumed from memory ' <<<"$flash" || fail "after kill -9: '$flash', want a resume from memory"
resumed=$(resumed_at "$job-worker-0")
[ "$resumed" -ge "$reported" ] || fail "flash checkpoints: resumed at step $resumed after step $reported was reported; $(flash_lines)"
log "A. torchrun mode: PET_* in torchrun, the rank its child; kill -9 of rank 1 -> generation 3 ($(jp '{.status.lastRestart.reason}')), resumed from memory at step $resumed (step $reported reported: 0 lost)"
# The rest of the run without the monitor (rank 1 straggled in generation 1 only): the same script under torchrun reaches the final
# loss of the reference run, which started its ranks by hand as the per-rank mode does.
kill "$mon_pid" 2>/dev/null && wait "$mon_pid" 2>/dev/null || true
for p in "${ref_pids[@]}"; do wait "$p" || fail "the reference run failed: $(tail -3 "$ref_dir/rank0.log")"; done
ref_pids=()
ref=$(sed -n 's|^step 300/300 loss ||p' "$ref_dir/rank0.log")
[ -n "$ref" ] || fail "no final loss in the reference run"
wait_phase Succeeded 300
loss=$(final_loss)
close "$loss" "$ref" || fail "torchrun mode, after a straggler restart and a kill -9: final loss $loss differs from the reference run's $ref"
log "A. torchrun mode: Succeeded with the reference's final loss $loss (reference $ref), $((SECONDS - t0)) s after the job was created"
"$bin/railyard-monitor" --namespace "$ns" --listen 127.0.0.1:0 --interval 1 --straggler-window 10 \
  --prometheus-url "$PROMETHEUS_URL" >>"$work/mon.log" 2>&1 &
mon_pid=$!

# --- B. a frozen rank of a program that reports nothing, then scale 2 -> 3 -----------------------------------
t0=$SECONDS
wait_for 60 "A's pods to end" pods_ended "$job"
job=pytorch-ddp-b
AGENT_HANG=off apply_job 0.05 20 --no-progress
wait_for 120 "past step 40" sh -c "kubectl logs $job-worker-0 -n $ns 2>/dev/null | grep -q '^step 40/'"
[ -z "$(jp '{.status.step}')" ] || [ "$(jp '{.status.step}')" = 0 ] || fail "status.step $(jp '{.status.step}') from a run that reports none"
[ "$(generation)" = 1 ] || fail "a restart before any failure: $(jp '{.status.lastRestart}')"
signal_rank "$job-worker-1" SIGSTOP
t_freeze=$SECONDS
wait_for 90 "the monitor's restart request" sh -c "kubectl get tj $job -n $ns -o jsonpath='{.metadata.annotations}' | grep -q restart-request"
detect=$((SECONDS - t_freeze))
grep -q '"rule":"stopped"' <<<"$(annotation)" || fail "restart request: $(annotation)"
grep -q '"rank":1,' <<<"$(annotation)" || fail "the hang request names another rank: $(annotation)"
# 2 s stopped, the agent's 0.5 s poll, 1 s evaluations: well inside hangTimeoutSeconds (20), the silence rule's wait.
[ "$detect" -le 12 ] || fail "the stopped rank found after $detect s"
wait_for 60 "generation 2" sh -c "[ \"\$(kubectl get tj $job -n $ns -o jsonpath='{.status.generation}')\" -ge 2 ]"
wait_for 60 "the script resuming" sh -c "kubectl logs $job-worker-0 -n $ns | grep -q '^resumed from'"
log "B. hang (no progress, through Prometheus): stopped rule's restart request $detect s after the freeze ($(evidence)), resumed at step $(resumed_at "$job-worker-0")"
# The resize is the operator's alone: the monitor (started again for C) does not watch it.
kill "$mon_pid" 2>/dev/null && wait "$mon_pid" 2>/dev/null || true
mon_pid=""
# The same job grows while it trains: from 20 steps past the resumed one (the script checkpoints every 20).
from=$(resumed_at "$job-worker-0")
wait_for 120 "20 steps past the resume" sh -c "s=\$(kubectl logs $job-worker-0 -n $ns 2>/dev/null | sed -n 's|^step \([0-9]*\)/.*|\1|p' | tail -1); [ \"\${s:-0}\" -ge $((from + 20)) ]"
kubectl scale tj "$job" -n "$ns" --replicas 3 >/dev/null
wait_for 120 "a world of 3" sh -c "[ \"\$(kubectl get tj $job -n $ns -o jsonpath='{.status.world.size}')\" = 3 ]"
wait_for 60 "rank 2 of 3 training" sh -c "kubectl logs $job-worker-2 -n $ns 2>/dev/null | grep -q '^rank 2/3'"
# (grep on a here-string: grep -q ending a pipe early would fail kubectl with SIGPIPE under pipefail)
grep -q '^resumed from' <<<"$(kubectl logs "$job-worker-2" -n "$ns")" || fail "the third rank did not resume from the checkpoint"
third=$(resumed_at "$job-worker-2") # now: a finished job's pods go (cleanPodPolicy Running), and their logs with them
names_check "$job-worker-2" 3 0 # the new world's hostfile names all three pods (one exec: the job is near its end)
wait_phase Succeeded 300
log "B. scale 2 -> 3: world of 3, rank 2 resumed at step $third, Succeeded $((SECONDS - t0)) s after the job was created"
wait_for 60 "B's pods to end" pods_ended "$job"

# --- C. one job, three faults, the undisturbed run's final loss ----------------------------------------------
t0=$SECONDS
# excludeFailedNodes false: the hang restarts in place, so the node loss after it still finds a free node of the three
# (flow A shows a blamed node excluded and its pod moved).
"$bin/railyard-monitor" --namespace "$ns" --listen 127.0.0.1:0 --interval 1 --straggler-window 10 --stopped-seconds 0 --idle-seconds 0 \
  >>"$work/mon.log" 2>&1 &
mon_pid=$!
export KEEP_NODES=1
job=pytorch-ddp-c
AGENT_HANG=off apply_job 0.05 60
unset KEEP_NODES
wait_for 120 "the job's pods Running" sh -c "[ \"\$(kubectl get pods -n $ns -l railyard.dev/job=$job --field-selector=status.phase=Running -o name | wc -l)\" = 2 ]"
# 1. the launcher, the ranks' environment, the restricted profile
pod=$job-worker-0
[ "$(kubectl get pod "$pod" -n "$ns" -o jsonpath='{.spec.initContainers[0].name}')" = railyard-launcher ] ||
  fail "no launcher init container"
restricted_pods "$ns" "railyard.dev/job=$job" || fail "a program pod (launcher init step included) breaks the restricted profile (above)"
kubectl exec "$pod" -n "$ns" -- python3 -c 'import shutil, sys; sys.exit(0 if shutil.which("railyard-worker") is None else 1)' ||
  fail "the example image has a railyard-worker on its PATH: the test would not show the launcher at work"
# Running means the launcher finished and the agent started; the ranks start once the world is complete.
wait_for 60 "the python rank in $pod" sh -c "kubectl logs $pod -n $ns | grep -q '^rank 0/2'"
kubectl exec "$pod" -n "$ns" -- python3 -c "$rank_env_py"'
want = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
        "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_RUN_ID", "RAILYARD_CHECKPOINT_DIR", "RAILYARD_PROGRESS_FILE"]
missing = [k for k in want if k not in env]
assert not missing, f"missing {missing}"
assert env["WORLD_SIZE"] == "2" and env["GROUP_WORLD_SIZE"] == "2" and env["TORCHELASTIC_MAX_RESTARTS"] == "5", env
assert "RAILYARD_RENDEZVOUS_TOKEN" not in env
assert env.get("HOME") == "/home/railyard" and env.get("HF_HOME") == "/home/railyard/.cache/huggingface", env
' 2>"$work/env.err" || fail "torchrun's environment in the container: $(tail -2 "$work/env.err")"
# The program's home is writable under the read-only root filesystem and uid 65532 (pip, Hugging Face, Triton caches).
kubectl exec "$pod" -n "$ns" -- python3 -c '
import os
for d in ("~", os.environ["XDG_CACHE_HOME"], os.environ["TRITON_CACHE_DIR"], os.environ["MPLCONFIGDIR"]):
    d = os.path.expanduser(d)
    os.makedirs(d, exist_ok=True)
    open(os.path.join(d, "probe"), "w").write("ok")
' 2>"$work/home.err" || fail "the program's HOME or caches are not writable: $(tail -2 "$work/home.err")"
# Stable names: the job's headless Service, MASTER_ADDR a DNS name (training below works with it), the hostfile.
[ "$(kubectl get service "$job" -n "$ns" -o jsonpath='{.spec.clusterIP}')" = None ] || fail "no headless Service $job"
names_check "$pod" 2
# The reference read the same text as the image (Debian's base-files).
[ "$(kubectl exec "$pod" -n "$ns" -- python3 -c 'import hashlib; print(hashlib.sha256(open("/usr/share/common-licenses/GPL-3", "rb").read()).hexdigest())')" = \
  "$(sha256sum /usr/share/common-licenses/GPL-3 | cut -d' ' -f1)" ] || fail "the image's GPL-3 text differs from the host's"
wait_for 120 "past step 40" sh -c "s=\$(kubectl get tj $job -n $ns -o jsonpath='{.status.step}'); [ \"\${s:-0}\" -ge 40 ]"
# The monitor has watched the job for a while by now: the ranks' targets are up, nothing to restart.
[ "$(generation)" = 1 ] && [ -z "$(annotation)" ] ||
  fail "a restart before any failure (generation $(generation), request '$(annotation)')"
grep -q 'railyard_worker_step' <<<"$(curl -s "http://$(kubectl get pod "$job-worker-0" -n "$ns" -o jsonpath='{.status.podIP}'):9400/metrics")" ||
  fail "no railyard_worker_step on $job-worker-0's metrics port"
log "C1. launcher, torchrun environment, stable names (MASTER_ADDR $job-worker-0.$job.$ns.svc.cluster.local, hostfile), restricted pods, no restart while training, metrics served"

# 2. kill -9 of one rank
wait_for 120 "past step 60" sh -c "s=\$(kubectl get tj $job -n $ns -o jsonpath='{.status.step}'); [ \"\${s:-0}\" -ge 60 ]"
uids=$(kubectl get pods -n "$ns" -l "railyard.dev/job=$job" -o jsonpath='{.items[*].metadata.uid}')
reached=$(step)
signal_rank "$job-worker-1" SIGKILL
wait_for 60 "generation 2" sh -c "[ \"\$(kubectl get tj $job -n $ns -o jsonpath='{.status.generation}')\" -ge 2 ]"
wait_for 60 "the script resuming" sh -c "kubectl logs $job-worker-0 -n $ns | grep -q '^resumed from'"
resumed=$(resumed_at "$job-worker-0")
[ "$(kubectl get pods -n "$ns" -l "railyard.dev/job=$job" -o jsonpath='{.items[*].metadata.uid}')" = "$uids" ] ||
  fail "the kill re-created pods (want an in-place restart)"
[ "$resumed" -ge "$reached" ] || fail "resumed at $resumed after step $reached was reported: flash checkpoints lost steps"
grep -q '^resumed from memory ' <<<"$(kubectl logs "$job-worker-0" -n "$ns" | grep '^resumed from' | tail -1)" ||
  fail "after kill -9: not resumed from memory"
log "C2. kill -9: in place, resumed from memory at step $resumed (step $reached reported: 0 lost)"

# 3. a frozen rank: the monitor's stall rule (once the new generation has trained 40 steps and been scraped)
wait_for 120 "40 steps past the resume" sh -c "s=\$(kubectl get tj $job -n $ns -o jsonpath='{.status.step}/{.status.generation}'); [ \"\${s#*/}\" = 2 ] && [ \"\${s%/*}\" -ge $((resumed + 40)) ]"
[ -z "$(annotation)" ] || fail "a restart request before the freeze: $(annotation)"
reached=$(step)
signal_rank "$job-worker-1" SIGSTOP
t_freeze=$SECONDS
wait_for 60 "the monitor's restart request" sh -c "kubectl get tj $job -n $ns -o jsonpath='{.metadata.annotations}' | grep -q restart-request"
detect=$((SECONDS - t_freeze))
grep -q '"rule":"stall"' <<<"$(annotation)" || fail "restart request: $(annotation)"
wait_for 60 "generation 3" sh -c "[ \"\$(kubectl get tj $job -n $ns -o jsonpath='{.status.generation}')\" -ge 3 ]"
wait_for 60 "the script resuming again" sh -c "[ \"\$(kubectl logs $job-worker-0 -n $ns | grep -c '^resumed from')\" -ge 2 ]"
resumed=$(resumed_at "$job-worker-0")
[ "$((reached - resumed))" -le 20 ] || fail "resumed at $resumed after reaching $reached: more than the interval lost"
log "C3. hang (progress): restart requested $detect s after the freeze ($(evidence)), resumed at $resumed"
kill "$mon_pid" 2>/dev/null && wait "$mon_pid" 2>/dev/null || true
mon_pid=""

# 4. a lost node
gen=$(generation)
wait_for 120 "30 steps past the resume" sh -c "s=\$(kubectl get tj $job -n $ns -o jsonpath='{.status.step}'); [ \"\${s:-0}\" -ge $((resumed + 30)) ]"
lost=$(kubectl get pod "$job-worker-1" -n "$ns" -o jsonpath='{.spec.nodeName}')
bash "$cluster" stop-node "$lost" --state-dir "$state" >/dev/null
wait_for 120 "$job-worker-1 replaced on another node" sh -c "n=\$(kubectl get pod $job-worker-1 -n $ns -o jsonpath='{.spec.nodeName}'); [ -n \"\$n\" ] && [ \"\$n\" != $lost ] && [ \"\$(kubectl get pod $job-worker-1 -n $ns -o jsonpath='{.status.phase}')\" = Running ]"
wait_for 120 "the replaced rank resuming" sh -c "kubectl logs $job-worker-1 -n $ns | grep -q '^resumed from'"
# Its memory went with the node; pod 0 held a copy of rank 1's slots (the peer copy), which the new pod fetched.
from_where=$(kubectl logs "$job-worker-1" -n "$ns" | sed -n 's|^resumed from \([a-z]*\) at step \([0-9]*\) .*|\1 \2|p' | tail -1)
[ "${from_where%% *}" = peer ] || fail "the replaced rank resumed from '${from_where}', want its peer's copy"
wait_phase Succeeded 300
[ "$(jp '{.status.progress}')" = 300/300 ] || fail "progress $(jp '{.status.progress}'), want 300/300"
[ "$(jp '{.status.restarts}')" = 3 ] || fail "restarts $(jp '{.status.restarts}'), want 3 (one per fault)"
loss=$(final_loss)
close "$loss" "$ref" || fail "after kill -9, a hang and a node loss: final loss $loss differs from the reference run's $ref"
log "C4. node $lost lost (generation $gen -> $(generation)): $job-worker-1 moved to $(kubectl get pod "$job-worker-1" -n "$ns" -o jsonpath='{.spec.nodeName}'), resumed from its peer's copy at step ${from_where#* }; Succeeded 300/300 with 3 restarts in $((SECONDS - t0)) s, final loss $loss (reference $ref)"

log "program e2e: ok in $((SECONDS - t_all)) s"
