#!/usr/bin/env bash
# The README's main command, scripts/demo.sh, run unattended with the binaries already built (DEMO_SKIP_BUILD=1) on
# a cluster of its own (3 real nodes, a local Prometheus; state in the build dir, brought down at the
# end). Asserts what the demo claims: both jobs Succeeded, two failures injected (kill -9, hang), the kill recovered
# in place (same pods), the hang found by its agent (lastRestart: Hang of rank 1, detector agent, within 3 s) and the pod
# restarted in place, and the summary printed (steps, final loss, time lost). Label `demo`: not in the default
# CI run (scripts/test.sh), about 2.5 minutes here; run it with `ctest -L demo`.
set -euo pipefail
src=${RAILYARD_SOURCE_DIR:?}
bin=${RAILYARD_BIN_DIR:?}
state=$(realpath -m "$bin/../demo-test-state")
out=$(mktemp /tmp/demo-test.XXXXXX)
cleanup() {
  if [ -f "$state/operator.pid" ]; then
    pid=$(cat "$state/operator.pid")
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "railyard-operator.*--rendezvous-bind" && kill "$pid" 2>/dev/null || true
  fi
  bash "$src/deploy/local/cluster.sh" down --state-dir "$state" >/dev/null 2>&1 || true
  rm -f "$out"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  tail -n 60 "$out" >&2
  exit 1
}
t0=$SECONDS
DEMO_SKIP_BUILD=1 DEMO_BUILD_DIR="$bin/.." RAILYARD_STATE_DIR="$state" DEMO_STEPS=60 \
  timeout 600 bash "$src/scripts/demo.sh" >"$out" 2>&1 || fail "scripts/demo.sh exited $?"
grep -qE '^tiny +Succeeded +60/60' "$out" || fail "the tiny job did not end Succeeded 60/60"
grep -q '^>> kill -9 ' "$out" || fail "no kill -9 injected"
grep -q 'after the kill -9 no pod was re-created' "$out" || fail "the kill -9 was not recovered in place"
grep -q '^>> SIGSTOP ' "$out" || fail "no hang injected"
req=$(sed -n 's/^>> restart: status.lastRestart=//p' "$out")
jq -e '.reason == "Hang" and .detector == "agent" and .rank == 1 and .detectSeconds <= 3' <<<"$req" >/dev/null ||
  fail "the second restart is not the agent's Hang of rank 1 found within 3 s: '$req'"
grep -qE 'after the hang pod [^ ]+ stayed on [^ ]+ \(restarted in place' "$out" || fail "pod 1 did not stay in place after the hang"
grep -qE '^steps 1000, final loss [0-9.]+, job Succeeded, restarts 2, failures injected 2 \(kill-9, hang\)$' "$out" ||
  fail "the summary line is missing or wrong: $(grep '^steps ' "$out")"
grep -qE '^steps redone [0-9]+; time lost [0-9.]+ s' "$out" || fail "no time lost in the summary"
grep -E '^steps |^kill-9 after|^hang after|^steps redone' "$out"
echo "demo test: ok in $((SECONDS - t0)) s"
