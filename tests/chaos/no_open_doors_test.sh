#!/usr/bin/env bash
# E2E "no open doors" (issue #13): after real jobs ran through railyard-operator + the worker agent + the rendezvous
# service, and railyard-monitor watched them, the jobs' rendezvous tokens and the monitor's webhook token must
# appear in no log (operator and agents at debug level, monitor, node agent, every pod log), in no /metrics output
# (operator, monitor, every agent) and in no object the operator writes inline (pods, TrainingJobs, events); the
# workers the agent starts must not see the token in their environment. The rendezvous service refuses a request
# without a token (401), with a wrong token and with another job's token (404, answered exactly like an unknown job
# so job names cannot be probed), the monitor's webhook refuses no
# token, a wrong one and a job's rendezvous token (401), and no refusal echoes a token. An operator given a
# kubeconfig with a CA that did not sign the API server's certificate must not reach the API server. Worker pods carry
# the secure defaults (non-root, read-only root, no escalation, /tmp and /dev/shm emptyDirs); a job whose data path
# leaves the operator's --data-root through '..' is Invalid (PathOutsideRoot) and gets no pods.
# Writes $RAILYARD_RESULTS_DIR/no_open_doors.json (counts of the checks) when that variable is set.
set -euo pipefail
# shellcheck source=../e2e/lib/cluster_env.sh
source "${RAILYARD_SOURCE_DIR:?}/tests/e2e/lib/cluster_env.sh" doors-e2e railyard-operator railyard-worker railyard-monitor
agent_bin=$bin/railyard-worker
pids=()
t_start=$SECONDS
fail() {
  echo "FAIL: $*" >&2
  dump_jobs
  for f in "$work"/op.log "$work"/monitor.log; do echo "--- $f (tail)"; tail -n 30 "$f"; done >&2
  exit 1
}
trap chaos_cleanup EXIT
# shellcheck source=lib.sh
source "$src/tests/chaos/lib.sh"
checks=0
ok() { checks=$((checks + 1)); }

# shellcheck source=../e2e/lib/job_manifest.sh
source "$src/tests/e2e/lib/job_manifest.sh"
# job NAME REPLICAS SCRIPT: runs through the agent, which logs at debug level
job() { job_manifest "$1" replicas="$2" agent="$3" maxRestarts=2 env="{name: RAILYARD_LOG_LEVEL, value: debug}"; }

setup_namespace

# 1. TLS to the API server is verified: a CA that did not sign the server's certificate stops the operator before
#    it reconciles anything. (Client-level: kube_e2e_tests "a CA that did not sign the server certificate".)
openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=wrong-ca -days 1 -keyout "$work/wrong-ca.key" \
  -out "$work/wrong-ca.crt" >/dev/null 2>&1
python3 - "$KUBECONFIG" "$work/wrong-ca.crt" "$work/wrong.kubeconfig" <<'PY'
import base64, re, sys
text = open(sys.argv[1]).read()
ca = base64.b64encode(open(sys.argv[2], "rb").read()).decode()
out, n = re.subn(r"certificate-authority-data: \S+", "certificate-authority-data: " + ca, text)
assert n == 1, "kubeconfig has no certificate-authority-data"
open(sys.argv[3], "w").write(out)
PY
# With leader election the operator's first call is a GET of the lease namespace: it must fail on TLS at once.
set +e
KUBECONFIG=$work/wrong.kubeconfig timeout 20 "$bin/railyard-operator" --namespace "$ns" --leader-elect \
  --leader-election-namespace "$ns" --metrics-addr 127.0.0.1:0 --health-addr 127.0.0.1:0 \
  --rendezvous-bind 127.0.0.1:0 >"$work/op-wrong-ca.log" 2>&1
rc=$?
set -e
[ "$rc" != 0 ] && [ "$rc" != 124 ] || fail "operator with a wrong CA: exit code $rc (want a prompt error exit)"
grep -q "TLS verification failed" "$work/op-wrong-ca.log" ||
  fail "operator with a wrong CA did not report a TLS verification failure: $(tail -n 3 "$work/op-wrong-ca.log")"
! grep -q "informers synced" "$work/op-wrong-ca.log" || fail "operator synced through an unverified server"
ok
echo "wrong CA: operator exits $rc with a TLS verification error"

# 2. Real jobs: operator (debug logs) + agents (debug logs) + monitor with a webhook token.
op_metrics=$(free_port)
# Pod IPs come from one 127.16/16 range in every local cluster on the machine: a random port keeps our agents' metrics
# listeners clear of another cluster's pods that got the same IPs.
agent_metrics=$(free_port)
"$bin/railyard-operator" --namespace "$ns" --leader-elect=false --worker-command "$agent_bin" --log-level debug \
  --metrics-addr "127.0.0.1:$op_metrics" --health-addr "127.0.0.1:$(free_port)" --rendezvous-bind 127.0.0.1:0 \
  --agent-metrics-port "$agent_metrics" --data-root /tmp/none --checkpoint-root "$work/ckpt" >"$work/op.log" 2>&1 &
pids+=("$!")
wait_for 30 "the operator to start" grep -q "leading: reconciling" "$work/op.log"
rdzv=$(grep -m1 "leading: reconciling" "$work/op.log" | grep -o 'rendezvous=[^ ]*' | cut -d= -f2)
[ -n "$rdzv" ] || fail "no rendezvous address in the operator's log"
rdzv=127.0.0.1:${rdzv##*:}

webhook_token=$(openssl rand -hex 24)
printf '%s\n' "$webhook_token" >"$work/webhook-token"
mon_port=$(free_port)
RAILYARD_LOG_LEVEL=debug "$bin/railyard-monitor" --namespace "$ns" --listen "127.0.0.1:$mon_port" \
  --webhook-token-file "$work/webhook-token" --interval 1 --unreachable 600 >"$work/monitor.log" 2>&1 &
pids+=("$!")
wait_for 30 "the monitor to serve" curl -fsS "http://127.0.0.1:$mon_port/healthz"

# done-job runs to the end first; then a and b keep running so the rendezvous service knows both while we knock.
# One after the other: the cluster has 4 nodes and one worker pod per node, so had all three been applied at once the
# scheduler could give the nodes to a and b (equal creation second, name order) and done-job would wait for them.
job done-job 2 'env | sort; sleep 2' | kubectl apply -n "$ns" -f - >/dev/null
# A job whose data path leaves the operator's --data-root through '..' is Invalid, naming the field.
job escape 1 'true' | sed 's|/tmp/none/train_\*.bin|/tmp/none/../etc/train_*.bin|' | kubectl apply -n "$ns" -f - >/dev/null
wait_for 90 "job done-job to succeed" phase_is done-job Succeeded
job a 2 'env | sort; sleep 600' | kubectl apply -n "$ns" -f - >/dev/null
job b 1 'env | sort; sleep 600' | kubectl apply -n "$ns" -f - >/dev/null
wait_for 60 "job a to run" phase_is a Running
wait_for 60 "job b to run" phase_is b Running
wait_for 30 "job escape to be Invalid" phase_is escape Invalid
# Running means bound, not started: under load (CI) the agents of a and b may not have served metrics or started
# their workers yet, and steps 5 and 6 read both from the pods' logs.
started() {
  local n=0 f
  for f in "$state/node-agent/pods/${ns}_"a-worker-*/*.log "$state/node-agent/pods/${ns}_"b-worker-*/*.log; do
    grep -q "serving metrics" "$f" 2>/dev/null && grep -q "^RANK=" "$f" 2>/dev/null && n=$((n + 1))
  done
  [ "$n" = 3 ]
}
wait_for 60 "the agents and workers of a and b to start" started
reason=$(kubectl get tj escape -n "$ns" -o jsonpath='{.status.conditions[?(@.type=="Invalid")].reason}')
msg=$(kubectl get tj escape -n "$ns" -o jsonpath='{.status.conditions[?(@.type=="Invalid")].message}')
[ "$reason" = PathOutsideRoot ] && [[ "$msg" == "spec.data.train "*"outside the operator's --data-root /tmp/none"* ]] ||
  fail "job escape: Invalid reason '$reason', message '$msg'"
[ -z "$(kubectl get pods -n "$ns" -l railyard.dev/job=escape -o name)" ] || fail "job escape got pods"
ok
echo "path roots: a data path leaving --data-root through '..' is Invalid (PathOutsideRoot)"
token_of() { kubectl get secret "$1-rendezvous" -n "$ns" -o jsonpath='{.data.token}' | base64 -d; }
tok_done=$(token_of done-job)
tok_a=$(token_of a)
tok_b=$(token_of b)
for t in "$tok_done" "$tok_a" "$tok_b"; do [ "${#t}" -ge 16 ] || fail "a job token is shorter than 16 characters"; done
[ "$tok_a" != "$tok_b" ] && [ "$tok_a" != "$tok_done" ] || fail "two jobs share a rendezvous token"
ok

# 3. The rendezvous service: knock without, with a wrong and with another job's token; the right one gets in.
knock() { # knock OUT-PREFIX AUTH-HEADER-OR-EMPTY [JOB]: POST /v1/status for JOB (a), pod a-worker-0; prints the code
  local hdr=()
  [ -n "$2" ] && hdr=(-H "Authorization: $2")
  curl -sS -o "$work/$1.body" -w '%{http_code}' --cacert "$work/rdzv-ca.crt" "${hdr[@]}" \
    -H 'Content-Type: application/json' \
    -d "{\"namespace\":\"$ns\",\"job\":\"${3:-a}\",\"pod\":\"a-worker-0\",\"generation\":1,\"wait_ms\":0}" \
    "https://$rdzv/v1/status"
}
# The service speaks TLS (--rendezvous-tls auto): its CA is in each job's Secret. Without that CA, or over plain HTTP,
# no request (and no token) gets through.
kubectl get secret a-rendezvous -n "$ns" -o jsonpath='{.data.ca\.crt}' | base64 -d >"$work/rdzv-ca.crt"
grep -q "BEGIN CERTIFICATE" "$work/rdzv-ca.crt" || fail "job a's Secret has no ca.crt"
rc=0
curl -sS -o /dev/null -H "Authorization: Bearer $tok_a" -d '{}' "https://$rdzv/v1/status" 2>/dev/null || rc=$?
[ "$rc" = 60 ] || fail "rendezvous over HTTPS without the CA: curl exit $rc, want 60 (certificate not trusted)"
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 -H "Authorization: Bearer $tok_a" -d '{}' \
  "http://$rdzv/v1/status" || true)
[ "${code#2}" = "$code" ] || fail "rendezvous answered plain HTTP ($code)"
ok
wrong=$(openssl rand -hex 24)
[ "$(knock none '')" = 401 ] || fail "rendezvous without a token: $(cat "$work/none.body")"
[ "$(knock basic "Basic $(printf 'x:%s' "$tok_a" | base64 -w0)")" = 401 ] || fail "rendezvous with Basic auth"
# A wrong token and an unknown job answer alike (404 unknown_job, same body), so job names cannot be probed.
[ "$(knock wrong "Bearer $wrong")" = 404 ] || fail "rendezvous with a wrong token: $(cat "$work/wrong.body")"
[ "$(knock other "Bearer $tok_b")" = 404 ] || fail "rendezvous with job b's token for job a: $(cat "$work/other.body")"
[ "$(knock prefix "Bearer ${tok_a:0:$((${#tok_a} - 1))}")" = 404 ] || fail "rendezvous with a truncated token"
[ "$(knock ghost "Bearer $tok_a" zz)" = 404 ] || fail "rendezvous for an unknown job: $(cat "$work/ghost.body")"
[ "$(sed 's/zz/a/g' "$work/ghost.body")" = "$(cat "$work/wrong.body")" ] ||
  fail "an unknown job and a wrong token answer differently: '$(cat "$work/ghost.body")' vs '$(cat "$work/wrong.body")'"
[ "$(knock right "Bearer $tok_a")" = 200 ] || fail "rendezvous with job a's own token: $(cat "$work/right.body")"
for f in none basic wrong other prefix ghost right; do
  for t in "$tok_a" "$tok_b" "$tok_done" "$wrong"; do
    ! grep -qF -- "$t" "$work/$f.body" || fail "rendezvous reply '$f' echoes a token: $(cat "$work/$f.body")"
  done
  ok
done
echo "rendezvous: TLS only (no CA: refused; plain HTTP: no answer); 401 without/with Basic, 404 wrong/other job's/truncated token = unknown job, 200 own token; no token echoed"

# 4. The monitor's webhook.
hook() { # hook OUT-PREFIX AUTH-HEADER-OR-EMPTY
  local hdr=()
  [ -n "$2" ] && hdr=(-H "Authorization: $2")
  curl -sS -o "$work/$1.body" -w '%{http_code}' "${hdr[@]}" -H 'Content-Type: application/json' \
    -d '{"version":"4","status":"firing","alerts":[]}' "http://127.0.0.1:$mon_port/webhook/alertmanager"
}
[ "$(hook h-none '')" = 401 ] || fail "webhook without a token: $(cat "$work/h-none.body")"
[ "$(hook h-wrong "Bearer $wrong")" = 401 ] || fail "webhook with a wrong token: $(cat "$work/h-wrong.body")"
[ "$(hook h-job "Bearer $tok_a")" = 401 ] || fail "webhook with a job's rendezvous token"
[ "$(hook h-prefix "Bearer ${webhook_token:0:10}")" = 401 ] || fail "webhook with a prefix of its token"
code=$(hook h-right "Bearer $webhook_token")
[ "$code" != 401 ] && [ "$code" != 403 ] && [ "$code" != 503 ] || fail "webhook refused its own token: $code"
for f in h-none h-wrong h-job h-prefix h-right; do
  for t in "$webhook_token" "$wrong" "$tok_a"; do
    ! grep -qF -- "$t" "$work/$f.body" || fail "webhook reply '$f' echoes a token: $(cat "$work/$f.body")"
  done
  ok
done
echo "webhook: 401 without/wrong/job's/prefix token, $code with its own; no token echoed"

# 5. Every /metrics output: operator, monitor, each agent (pod IP : agent metrics port, from the agents' logs).
sleep 2 # one more monitor evaluation over the running jobs
curl -fsS "http://127.0.0.1:$op_metrics/metrics" >"$work/metrics-operator.txt"
curl -fsS "http://127.0.0.1:$mon_port/metrics" >"$work/metrics-monitor.txt"
n_agents=0
for log in "$state/node-agent/pods/${ns}_"a-worker-*/*.log "$state/node-agent/pods/${ns}_"b-worker-*/*.log; do
  addr=$(grep -m1 "serving metrics" "$log" | grep -o 'address=[^ ]*' | cut -d= -f2) ||
    fail "no 'serving metrics' line in $log"
  curl -fsS "http://$addr" >"$work/metrics-agent-$n_agents.txt" || fail "cannot scrape agent metrics at $addr"
  n_agents=$((n_agents + 1))
done
[ "$n_agents" = 3 ] || fail "scraped $n_agents agents, want 3"
grep -q '^railyard_' "$work/metrics-operator.txt" || fail "operator /metrics has no railyard series"
grep -q '^railyard_monitor_webhook_requests_total' "$work/metrics-monitor.txt" || fail "monitor /metrics incomplete"

# 6. Every log and every object the operator writes inline. The worker's env dump shows what the agent passes on.
pod_logs=("$state/node-agent/pods/${ns}_"*/*.log)
[ "${#pod_logs[@]}" -ge 5 ] || fail "found ${#pod_logs[@]} pod logs, want 5"
grep -q "^RANK=" "${pod_logs[0]}" || fail "the worker's env dump is missing from ${pod_logs[0]}"
! grep -q "^RAILYARD_RENDEZVOUS_TOKEN=" "${pod_logs[@]}" || fail "a worker sees RAILYARD_RENDEZVOUS_TOKEN"
# The job's CA key stays with the agent (it issues the pod's certificate); a worker gets only the pod's own pair.
! grep -q "^RAILYARD_JOB_CA_KEY=" "${pod_logs[@]}" || fail "a worker sees RAILYARD_JOB_CA_KEY"
grep -qi "debug" "$work/op.log" || fail "the operator did not log at debug level"
kubectl get pods,tj,events -n "$ns" -o json >"$work/objects.json"
grep -q "secretKeyRef" "$work/objects.json" || fail "pods do not take the token from the Secret"
# Worker pods as created carry the secure defaults (the local node agent runs them as processes and ignores them, so
# the jobs above ran with them): non-root, read-only root, no escalation, no capabilities, writable /tmp, /dev/shm.
n_secure=$(python3 - "$work/objects.json" <<'PY2'
import json, sys
n = 0
for o in json.load(open(sys.argv[1]))["items"]:
    if o["kind"] != "Pod":
        continue
    c = o["spec"]["containers"][0]
    sc = c.get("securityContext", {})
    want = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True, "runAsUser": 65532}
    bad = {k: sc.get(k) for k, v in want.items() if sc.get(k) != v}
    if sc.get("capabilities", {}).get("drop") != ["ALL"] or sc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        bad["capabilities/seccompProfile"] = [sc.get("capabilities"), sc.get("seccompProfile")]
    mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
    vols = {v["name"]: v for v in o["spec"].get("volumes", [])}
    if "/tmp" not in mounts or "emptyDir" not in vols.get(mounts["/tmp"], {}):
        bad["/tmp"] = "no emptyDir"
    if "/dev/shm" not in mounts or vols.get(mounts["/dev/shm"], {}).get("emptyDir", {}).get("medium") != "Memory":
        bad["/dev/shm"] = "no memory emptyDir"
    if bad:
        sys.exit("pod %s lacks secure defaults: %s" % (o["metadata"]["name"], bad))
    n += 1
print(n)
PY2
) || fail "worker pods: $n_secure"
[ "$n_secure" -ge 3 ] || fail "checked the security context of $n_secure pods, want >= 3"
ok
echo "security context: $n_secure worker pods non-root (65532), read-only root, no escalation, caps dropped, /tmp + /dev/shm"
# The agents' per-generation files (resolved config handed to the workers) too.
agent_files=()
while IFS= read -r f; do agent_files+=("$f"); done < <(find /tmp/railyard-agent -path "*/${ns}_*" -type f 2>/dev/null)
[ "${#agent_files[@]}" -ge 3 ] || fail "found ${#agent_files[@]} agent files under /tmp/railyard-agent, want >= 3"
scanned=("$work/op.log" "$work/monitor.log" "$state/logs/node-agent.log" "${pod_logs[@]}" "$work"/metrics-*.txt
  "$work/objects.json" "${agent_files[@]}")
# The rendezvous CA's private key (one line of its base64 body, long enough to be unique) must not leak either.
ca_key_line=$(kubectl get secret railyard-rendezvous-ca -n "$ns" -o jsonpath='{.data.ca\.key}' | base64 -d |
  grep -v -- '-----' | head -1)
[ "${#ca_key_line}" -ge 32 ] || fail "no CA key in Secret railyard-rendezvous-ca"
# And the jobs' own CA keys (job-ca.key, docs/hardening.md "The job's own identity"): the second base64 line, since
# the first one of every P-256 key starts with the same algorithm identifiers.
job_ca_key_line() {
  kubectl get secret "$1-rendezvous" -n "$ns" -o jsonpath='{.data.job-ca\.key}' | base64 -d | grep -v -- '-----' | sed -n 2p
}
jk_a=$(job_ca_key_line a) jk_b=$(job_ca_key_line b)
[ "${#jk_a}" -ge 32 ] && [ "${#jk_b}" -ge 32 ] || fail "no job-ca.key in the Secrets of jobs a and b"
for t in "$tok_done" "$tok_a" "$tok_b" "$webhook_token" "$ca_key_line" "$jk_a" "$jk_b"; do
  hits=$(grep -lF -- "$t" "${scanned[@]}" || true)
  [ -z "$hits" ] || fail "a secret value appears in: $hits"
done
# base64 of the tokens (as in a Secret's data) must not leak either.
for t in "$tok_a" "$tok_b"; do
  b64=$(printf '%s' "$t" | base64 -w0)
  ! grep -qF -- "$b64" "${scanned[@]}" || fail "a base64-encoded token appears in a log or metrics output"
done
ok
echo "no token in ${#scanned[@]} files: operator/monitor/node-agent logs, ${#pod_logs[@]} pod logs," \
  "$((n_agents + 2)) /metrics outputs, pods/TrainingJobs/events, ${#agent_files[@]} agent files"

secs=$((SECONDS - t_start))
checks=$((checks + ${#scanned[@]}))
if [ -n "${RAILYARD_RESULTS_DIR:-}" ]; then
  mkdir -p "$RAILYARD_RESULTS_DIR"
  cat >"$RAILYARD_RESULTS_DIR/no_open_doors.json" <<JSON
{"test": "e2e_no_open_doors", "date": "$(date -u +%FT%TZ)", "seconds": $secs, "passed": true,
 "rendezvous_refusals": 6, "webhook_refusals": 4, "files_scanned": ${#scanned[@]}, "pod_logs": ${#pod_logs[@]},
 "metrics_endpoints": $((n_agents + 2)), "tokens_checked": 4, "secure_pods": $n_secure, "wrong_ca_refused": true, "path_outside_root_refused": true, "checks": $checks}
JSON
fi
echo "no open doors e2e: ok in ${secs}s"
