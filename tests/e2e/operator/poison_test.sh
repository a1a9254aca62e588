#!/usr/bin/env bash
# E2E (issue #40): no TrainingJob, from any namespace, stops the operator. One railyard-operator watching every
# namespace gets hostile specs in one namespace and a good job in another:
#   - the spec of the issue (replicas 4, globalBatch 8, microBatch 2^30: microBatch*data wrapped to 0 and the modulo
#     SIGFPE'd the operator within a second, and again after each restart);
#   - tensor*pipeline*context = 4*1024*2^20 (wrapped to 0, the same trap);
#   - every integer at the CRD's maximum in combinations the API server accepts (64-bit overflow of
#     data*context*tensor*pipeline; microBatch*data over 640,000 ranks; all the step, checkpoint, restart and time
#     fields at once);
#   - replicas one above the CRD's maximum (the API server refuses it, naming the field);
#   - a pod template whose metadata.labels is a string (spec.template keeps unknown fields, so only the operator
#     sees it): the pod builder throws, and the job is held Invalid with reason ReconcileError (poison.h).
# Asserted: the operator process started here is alive under the same pid from start to end, every accepted hostile
# job ends phase Invalid with a condition naming the field (ReconcileError and the cause for the throwing one), none
# of them gets a pod, the throwing job is not retried at full speed, the good job Succeeds, and the operator's log
# shows no crash. RAILYARD_BIN_DIR may point at another build's bin/ (it only needs railyard-operator): against the
# operator before the fix (65b572a) this test fails with the operator dead of SIGFPE.
set -euo pipefail
# shellcheck source=../lib/cluster_env.sh
source "${RAILYARD_SOURCE_DIR:?}/tests/e2e/lib/cluster_env.sh" op-poison # its ns unused: two namespaces below
good_ns=op-poison-good-$$
bad_ns=op-poison-hostile-$$
op_pid=""
fail() {
  echo "FAIL: $*" >&2
  kubectl get tj,pods -n "$good_ns" -o wide >&2 || true
  kubectl get tj,pods -n "$bad_ns" -o wide >&2 || true
  for n in "$good_ns" "$bad_ns"; do
    kubectl get tj -n "$n" -o jsonpath='{range .items[*]}{.metadata.name}{": "}{.status}{"\n"}{end}' >&2 || true
  done
  echo "--- operator log (tail)" >&2
  tail -n 40 "$work/op.log" >&2 || true
  exit 1
}
cleanup() {
  if [ -n "$op_pid" ]; then kill "$op_pid" 2>/dev/null || true; wait "$op_pid" 2>/dev/null || true; fi
  kubectl delete namespace "$good_ns" "$bad_ns" --wait=false >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
# shellcheck source=../lib/job_manifest.sh
source "$src/tests/e2e/lib/job_manifest.sh"

# The operator is alive under the pid started here; else fail with how it ended (128+8 is SIGFPE).
check_alive() {
  kill -0 "$op_pid" 2>/dev/null && return 0
  local rc=0
  wait "$op_pid" || rc=$?
  op_pid=""
  local how="exit status $rc"
  [ "$rc" -gt 128 ] && how="killed by signal $((rc - 128)) ($(kill -l $((rc - 128)) 2>/dev/null || echo '?'))"
  fail "the operator died ($how) while $1"
}
# wait_alive SECONDS DESCRIPTION COMMAND...: wait_for that fails at once when the operator dies.
wait_alive() {
  local limit=$1 what=$2 t0=$SECONDS
  shift 2
  until "$@" >/dev/null 2>&1; do
    check_alive "waiting for $what"
    [ $((SECONDS - t0)) -lt "$limit" ] || fail "timed out after ${limit}s waiting for $what"
    sleep 0.3
  done
  check_alive "waiting for $what"
}
phase_is() { [ "$(kubectl get tj "$2" -n "$1" -o jsonpath='{.status.phase}' 2>/dev/null)" = "$3" ]; } # NS JOB PHASE
invalid_condition() { # JOB: "reason|message" of the job's Invalid condition
  kubectl get tj "$1" -n "$bad_ns" \
    -o jsonpath='{range .status.conditions[?(@.type=="Invalid")]}{.reason}{"|"}{.message}{end}'
}
# hostile NAME SPEC-YAML: a TrainingJob in the hostile namespace, spec given whole (indented two spaces); prints
# kubectl's output, returns its status.
hostile() {
  printf 'apiVersion: railyard.dev/v1alpha1\nkind: TrainingJob\nmetadata: {name: %s}\nspec:\n%s\n' "$1" "$2" |
    kubectl apply -n "$bad_ns" -f - 2>&1
}
# accepted NAME SPEC-YAML: hostile NAME, which the API server must accept.
accepted() {
  local out
  out=$(hostile "$1" "$2") || fail "the API server refused $1: $out"
}
# The trainer's fields every hostile job shares (pods, were any made, would run a shell command, never the trainer).
common='  device: cpu
  data: {train: /tmp/none/train_*.bin}
  template:
    spec:
      containers:
        - command: ["sh", "-c", "exit 0"]'
custom_model='  model: {preset: custom, layers: 1024, hidden: 65536, heads: 1024, seqLen: 1048576, vocab: 1048576}'

install_crd "$src"
for n in "$good_ns" "$bad_ns"; do
  kubectl create namespace "$n" >/dev/null
  wait_for 60 "the default service account token of $n" \
    bash -c "kubectl get sa default -n $n -o jsonpath='{.secrets[0].name}' | grep -q ."
done

# Every namespace (no --namespace): the issue is a job from any namespace stopping every other namespace's jobs. The
# rendezvous CA goes to the good namespace (the default, railyard-system, need not exist on this cluster).
hp=$(free_port)
"$bin/railyard-operator" --leader-elect=false --metrics-addr 127.0.0.1:0 --health-addr "127.0.0.1:$hp" \
  --rendezvous-bind 127.0.0.1:0 --rendezvous-ca-secret "$good_ns/railyard-rendezvous-ca" >"$work/op.log" 2>&1 &
op_pid=$!
first_pid=$op_pid
wait_alive 30 "/readyz (informers synced)" curl -fsS "http://127.0.0.1:$hp/readyz"
t_start=$SECONDS

# 1. Refused by the API server, the refusal naming the field and its maximum: replicas one above the CRD's maximum
# (kMaxReplicas), and the seed one above 2^53 - 1 (a schema maximum is a float64 there: INT64_MAX, as the CRD first
# had it, rounded to 2^63 and became INT64_MIN, so the CRD refused every seed and could not even be installed).
refused() { # NAME FIELD MAXIMUM SPEC-YAML
  local out
  if out=$(hostile "$1" "$4"); then fail "$1 was accepted: $out"; fi
  grep -qF "$2" <<<"$out" || fail "the refusal of $1 does not name $2: $out"
  grep -qF "less than or equal to $3" <<<"$out" || fail "the refusal of $1 does not give the maximum $3: $out"
  echo "refused by the API server: $1 ($(grep -oF "$2: Invalid value" <<<"$out" | head -1))"
}
refused over-max-replicas spec.replicas 10000 "  replicas: 10001
$common
  model: {preset: tiny}
  training: {steps: 10, globalBatch: 10001, microBatch: 1}"
refused over-max-seed spec.training.seed 9007199254740991 "  replicas: 1
$common
  model: {preset: tiny}
  training: {steps: 10, globalBatch: 8, microBatch: 1, seed: 9007199254740992}"

# 2. Accepted by the API server, each must end Invalid naming FIELD (the jobs of the table below).
declare -A want
want[issue40-microbatch]=spec.training.microBatch
accepted issue40-microbatch "  replicas: 4
$common
  model: {preset: tiny}
  training: {steps: 10, globalBatch: 8, microBatch: 1073741824}"
want[tpc-overflow]=spec.parallelism.context
accepted tpc-overflow "  replicas: 1
  procsPerReplica: 4
$common
  model: {preset: custom, layers: 1024, hidden: 1024, heads: 16, seqLen: 1048576, vocab: 2}
  training: {steps: 10, seqLen: 1048576, globalBatch: 8, microBatch: 1}
  parallelism: {tensor: 4, pipeline: 1024, context: 1048576}"
# data*context*tensor*pipeline = 2^24 * 2^40: past 64 bits.
want[max-degrees]=spec.parallelism.data
accepted max-degrees "  replicas: 10000
  procsPerReplica: 64
$common
$custom_model
  training: {steps: 2147483647, seqLen: 1048576, globalBatch: 1073741824, microBatch: 1073741824}
  parallelism: {data: 16777216, tensor: 1024, pipeline: 1024, context: 1048576}"
# microBatch*data = 2^30 * 640,000 (an int wrapped it to 0).
want[max-batch]=spec.training.globalBatch
accepted max-batch "  replicas: 10000
  procsPerReplica: 64
$common
  model: {preset: tiny}
  training: {steps: 2147483647, globalBatch: 1073741824, microBatch: 1073741824}"
# Every step, checkpoint, restart and time field at its maximum at once, on the largest world: all of them parsed,
# then the batch is refused (a globalBatch 640,000 divides would make this a valid job of 10,000 pods).
want[max-everything]=spec.training.globalBatch
accepted max-everything "  replicas: 10000
  procsPerReplica: 64
$common
$custom_model
  training: {steps: 2147483647, seqLen: 1048576, globalBatch: 1073741824, microBatch: 1, warmupSteps: 1099511627776,
    seed: 9007199254740991, valEvery: 1099511627776, sampleEvery: 1099511627776, sampleTokens: 1048576}
  checkpoint: {path: /tmp/none/ckpt, intervalSteps: 1099511627776, keep: 1000000, memoryIntervalSteps: 1099511627776}
  failurePolicy: {maxRestarts: 1000000, hangTimeoutSeconds: 2147483647, permanentExitCodes: [255], retryableExitCodes: [254]}
  runPolicy: {activeDeadlineSeconds: 2147483647, ttlSecondsAfterFinished: 2147483647}"
# A template the operator's code cannot build a pod from: labels must be a map. Nothing in the CRD types the template.
want[template-throws]=ReconcileError
accepted template-throws "  replicas: 1
  device: cpu
  data: {train: /tmp/none/train_*.bin}
  model: {preset: tiny}
  training: {steps: 10, globalBatch: 8, microBatch: 1}
  template:
    metadata: {labels: not-a-map}
    spec:
      containers:
        - command: [\"sh\", \"-c\", \"exit 0\"]"

# 3. The good job, in the other namespace, after the hostile ones: the operator must still manage it. Its time fields
# at the CRD's maxima (a valid spec near the limits runs).
job_manifest good command="sleep 1; exit 0" extra='  runPolicy: {activeDeadlineSeconds: 2147483647, ttlSecondsAfterFinished: 2147483647}' |
  kubectl apply -n "$good_ns" -f - >/dev/null

for j in "${!want[@]}"; do wait_alive 30 "job $j to be Invalid" phase_is "$bad_ns" "$j" Invalid; done
wait_alive 60 "the good job to succeed" phase_is "$good_ns" good Succeeded

# 4. Each Invalid condition names the field (or, for the throwing job, says why and what to change).
for j in "${!want[@]}"; do
  c=$(invalid_condition "$j")
  case $j in
    template-throws)
      [[ "$c" == ReconcileError\|* ]] || fail "$j: reason is not ReconcileError: $c"
      grep -q "cannot reconcile this spec" <<<"$c" || fail "$j: the message does not say the spec cannot be reconciled: $c"
      grep -q "type_error" <<<"$c" || fail "$j: the message does not give the cause (a json type_error): $c" ;;
    *) grep -qF "${want[$j]}" <<<"$c" || fail "$j: the Invalid condition does not name ${want[$j]}: $c" ;;
  esac
  echo "Invalid: $j: ${c:0:160}"
done
# None of them got a pod (a gang of 10,000 pods of a refused spec would be the next way to hurt the cluster).
[ -z "$(kubectl get pods -n "$bad_ns" -o name)" ] || fail "hostile jobs got pods: $(kubectl get pods -n "$bad_ns" -o name)"

# 5. A held job is not retried at full speed: one throw, then one try per 10 s at most (PoisonedJobs::kFirstRetry).
throws=$(grep -c "reconcile threw.*$bad_ns/template-throws" "$work/op.log" || true)
limit=$((1 + (SECONDS - t_start) / 10))
[ "$throws" -ge 1 ] || fail "the operator logged no 'reconcile threw' for template-throws"
[ "$throws" -le "$limit" ] || fail "template-throws threw $throws times in $((SECONDS - t_start)) s (at most $limit)"

# 6. The same process throughout, and no sign of a crash or an abort in its log.
check_alive "the test ended"
[ "$op_pid" = "$first_pid" ] || fail "the operator's pid changed"
if grep -nE "terminate called|Floating point|SIGFPE|Segmentation|Aborted|AddressSanitizer|runtime error:" "$work/op.log" >&2; then
  fail "the operator's log shows a crash"
fi
echo "operator pid $op_pid alive throughout ($((SECONDS - t_start)) s); ${#want[@]} hostile jobs Invalid; good job Succeeded"
echo "poison e2e: ok"
