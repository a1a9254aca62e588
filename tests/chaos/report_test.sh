#!/usr/bin/env bash
# scripts/reliability_report.py over made-up inputs: every number of the inputs reaches the table, a failed fuzzer
# counts as a crash, a sanitizer report in a test's output is counted, and a missing input says "not run" instead of a
# number.
set -euo pipefail
src=${RAILYARD_SOURCE_DIR:?}
work=$(mktemp -d /tmp/report-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() {
  echo "FAIL: $*" >&2
  cat "$work/out.md" >&2 || true
  exit 1
}
mkdir -p "$work/b/hardening/results" "$work/f/hardening" "$work/f/tests/fuzz/artifacts" "$work/t/hardening"
cat >"$work/b/hardening/results/restarts.json" <<'JSON'
{"test": "e2e_control_plane_restarts", "date": "2026-01-02T03:04:05Z", "seconds": 40, "passed": true,
 "faults": [{"kind": "etcd restart", "count": 1, "jobs_affected": 3, "jobs_correct": 3, "downtime_s": 1.9,
             "recovery_s": 1.1, "steps_lost": null}], "jobs": 5, "jobs_correct": 5}
JSON
cat >"$work/b/hardening/results/soak.json" <<'JSON'
{"test": "e2e_soak", "date": "2026-01-02T03:04:05Z", "seconds": 60, "passed": true, "soak_seconds": 47, "rounds": 7,
 "jobs_run": 32, "jobs_correct": 32, "rss_start_kib": 14336, "rss_end_kib": 14848, "fds_start": 16, "fds_end": 17,
 "samples": 24}
JSON
cat >"$work/b/hardening/results/elastic_chaos.json" <<'JSON'
{"test": "e2e_elastic_chaos", "date": "2026-01-02T03:04:05Z", "passed": true, "seed": 42, "steps": 300,
 "faults": [{"kind": "trainer kill -9", "count": 3, "detect_s_median": 0.4, "recovery_s_median": 1.25,
             "recovery_s_max": 2.5, "steps_lost_max": 0, "steps_lost_total": 0},
            {"kind": "operator kill -9 + restart", "count": 1, "detect_s_median": null, "recovery_s_median": null,
             "recovery_s_max": null, "steps_lost_max": 0, "steps_lost_total": 0}],
 "events": [{}, {}, {}, {}], "restarts": 3, "generations": 4, "final_loss": 2.5, "final_loss_equal": true,
 "params_bitwise_equal": true, "step_s_median": 0.11, "wall_s": 60, "goodput": 0.55}
JSON
cat >"$work/f/hardening/fuzz.xml" <<'XML'
<?xml version="1.0" encoding="UTF-8"?>
<testsuite tests="2" failures="1">
<testcase name="fuzz_job_spec" time="8.2" status="run"><system-out>stat::number_of_executed_units: 123457
Done 123457 runs in 8 second(s)</system-out></testcase>
<testcase name="fuzz_kubeconfig" time="3.0" status="fail"><failure message="Failed"/><system-out>==1==ERROR: AddressSanitizer: heap-buffer-overflow</system-out></testcase>
</testsuite>
XML
touch "$work/f/tests/fuzz/artifacts/kubeconfig-crash-0123"
cat >"$work/f/hardening/asan.xml" <<'XML'
<?xml version="1.0" encoding="UTF-8"?>
<testsuite tests="2" failures="1">
<testcase name="unit_common" time="1.5" status="run"><system-out>ok</system-out></testcase>
<testcase name="unit_metrics" time="2.5" status="fail"><failure message="Failed"/><system-out>x.cc:3:5: runtime error: signed integer overflow</system-out></testcase>
</testsuite>
XML

cat >"$work/t/hardening/tsan.xml" <<'XML'
<?xml version="1.0" encoding="UTF-8"?>
<testsuite tests="4" failures="1">
<testcase name="e2e_cluster_up" time="20" status="run"><system-out>up</system-out></testcase>
<testcase name="kube_unit_tests" time="3" status="run"><system-out>ok</system-out></testcase>
<testcase name="kube_e2e_informer" time="30" status="fail"><failure message="Failed"/><system-out>WARNING: ThreadSanitizer: data race (pid=1)</system-out></testcase>
<testcase name="e2e_cluster_down" time="2" status="run"><system-out>down</system-out></testcase>
</testsuite>
XML

python3 "$src/scripts/reliability_report.py" --build "$work/b" --fuzz-build "$work/f" --tsan-build "$work/t" \
  --out "$work/out.md" 2>/dev/null
out=$work/out.md
grep -qF '| etcd restart (1.9 s to restart) | 1 | 3 | 3 | 1.1 s | n/a (shell jobs) |' "$out" || fail "restart row"
grep -qF '| trainer kill -9 (real trainer) | 3 | 1 | 1 | 1.25 s (max 2.5 s) | max 0, total 0 | `e2e_elastic_chaos` (seed 42, 300 steps) |' "$out" ||
  fail "elastic chaos row"
grep -qF '| operator kill -9 + restart (real trainer) | 1 | 1 | 1 | n/a | max 0, total 0 |' "$out" || fail "elastic operator row"
grep -qF 'restarts 3 (generations 4), final loss 2.5 equal to' "$out" || fail "elastic summary"
grep -qF '| 47 s | 7 | 32 | 32 | 14.0 -> 14.5 MiB | 16 -> 17 |' "$out" || fail "soak row"
grep -qF '| `fuzz_job_spec` | 123,457 | 8 s | 0 |' "$out" || fail "fuzzer row"
grep -qF '| `fuzz_kubeconfig` | ? | 3 s | 1 |' "$out" || fail "a crashed fuzzer"
grep -qF 'Total: 2 fuzzers, 1 crashes.' "$out" || fail "fuzz total"
grep -qF '| ASan + UBSan (unit tests, `build-fuzz`) | 2 | 1 | 1 UBSan (failed: unit_metrics) | 4 s |' "$out" ||
  fail "ASan row"
# The cluster fixture's up/down are no tests of their own, but their time is the step's cost.
grep -qF '| TSan (concurrency tests, `build-tsan`) | 2 | 1 | 1 TSan (failed: kube_e2e_informer) | 55 s |' "$out" ||
  fail "TSan row"
python3 "$src/scripts/reliability_report.py" --build "$work/b" --fuzz-build "$work/f" --tsan-build "$work/none" \
  --out "$work/out.md" 2>/dev/null
grep -qF '| TSan (concurrency tests, `build-tsan`) | not run (no JUnit file) |' "$out" || fail "missing TSan input"
grep -qF '`e2e_chaos_operator`: not run (no result file)' "$out" || fail "missing chaos input"
grep -qF 'Not run (no `no_open_doors.json`).' "$out" || fail "missing no-open-doors input"
echo "reliability report test: ok"
