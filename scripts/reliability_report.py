#!/usr/bin/env python3
"""Regenerates docs/reliability.md (issue #13) from the outputs of the last test runs; no number is typed by hand.

Inputs (each optional; a missing one becomes a "not run" line, never a made-up number):
  <build>/hardening/results/{chaos,restarts,soak,no_open_doors}.json   written by the e2e tests in tests/chaos/
  <build>/hardening/results/elastic_chaos.json   written by e2e_elastic_chaos (tests/e2e/elastic, the real trainer)
  <fuzz-build>/hardening/fuzz.xml, asan.xml   ctest JUnit output of scripts/test.sh's fuzz and ASan+UBSan steps
  <fuzz-build>/tests/fuzz/artifacts/           libFuzzer crash/leak/timeout/oom artifacts
  <tsan-build>/hardening/tsan.xml              ctest JUnit output of the TSan step

  scripts/reliability_report.py [--build build] [--fuzz-build build-fuzz] [--tsan-build build-tsan]
                                [--out docs/reliability.md]
"""

import argparse
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

SANITIZER_PATTERNS = {
    "ASan": re.compile(r"ERROR: AddressSanitizer|ERROR: LeakSanitizer"),
    "UBSan": re.compile(r"runtime error:"),
    "TSan": re.compile(r"WARNING: ThreadSanitizer"),
}


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as e:
        sys.exit(f"reliability_report: {path} is not valid JSON ({e}); rerun the test that writes it")


def load_junit(path):
    """Returns [(name, passed, seconds, output)] or None when the file does not exist."""
    if not os.path.exists(path):
        return None
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        sys.exit(f"reliability_report: {path} is not valid JUnit XML ({e}); rerun scripts/test.sh")
    cases = []
    for tc in root.iter("testcase"):
        failed = tc.find("failure") is not None or tc.find("error") is not None or tc.get("status") == "fail"
        out = "".join((e.text or "") for e in tc if e.tag in ("system-out", "system-err", "failure", "error"))
        cases.append((tc.get("name", "?"), not failed, float(tc.get("time", "0") or 0), out))
    return cases


def fmt_s(v):
    return "n/a" if v is None else f"{v:g} s"


def fault_rows(chaos, restarts, soak, elastic=None, real=None):
    rows = []
    if chaos:
        p = chaos["proxy"]
        src = f"`e2e_chaos_operator` (seed {chaos['seed']})"
        jobs = (chaos["jobs_under_faults"], chaos["jobs_correct_under_faults"])
        rec = fmt_s(chaos.get("recovery_s"))
        for kind, n in [
            ("HTTP 429 (Retry-After: 1)", p.get("http_429", 0)),
            ("HTTP 500", p.get("http_500", 0)),
            ("HTTP 503", p.get("http_503", 0)),
            ("connection reset mid-request/stream", p.get("resets", 0)),
            ("connection stalled, then reset", p.get("stalls", 0)),
            ("connection refused (RST at accept)", p.get("refused", 0)),
            ("watch stream cut mid-event", p.get("truncated_watches", 0)),
            ("delayed chunk (0-40 ms)", p.get("delayed_chunks", 0)),
        ]:
            rows.append((kind, n, jobs[0], jobs[1], rec, "n/a (shell jobs)", src))
        rows.append(("operator kill -9 mid-flow (restarted behind the faults)", chaos["operator_kills"], jobs[0], jobs[1],
                     "not timed", "n/a (shell jobs)", src))
    if restarts:
        for f in restarts["faults"]:
            lost = "n/a (shell jobs)" if f.get("steps_lost") is None else str(f["steps_lost"])
            rows.append((f["kind"] + f" ({f['downtime_s']:g} s to restart)", f["count"], f["jobs_affected"],
                         f["jobs_correct"], fmt_s(f["recovery_s"]), lost, "`e2e_control_plane_restarts`"))
    if elastic:
        src = f"`e2e_elastic_chaos` (seed {elastic['seed']}, {elastic['steps']} steps)"
        ok = 1 if elastic.get("passed") and elastic.get("params_bitwise_equal") else 0
        for f in elastic["faults"]:
            rec = "n/a" if f.get("recovery_s_median") is None else \
                f"{f['recovery_s_median']:g} s (max {f['recovery_s_max']:g} s)"
            lost = f"max {f['steps_lost_max']}, total {f['steps_lost_total']}"
            rows.append((f["kind"] + " (real trainer)", f["count"], 1, ok, rec, lost, src))
    if real:
        src = f"`e2e_real_nodes` ({real['steps']} steps, {real['restarts']} restarts in all)"
        for f in real["faults"]:
            rows.append((f["kind"] + f" (real nodes; {f['restarts']} restart)", 1, 1, 1 if real.get("passed") else 0,
                         f"{f['recovery_s']} s ({f['recovery']})", str(f["steps_lost"]), src))
    if soak:
        rows.append(("soak: submit, fail, retry, scale, delete", soak["rounds"], soak["jobs_run"], soak["jobs_correct"],
                     "n/a", "n/a (shell jobs)", "`e2e_soak`"))
    return rows


def fuzz_rows(fuzz, artifacts_dir):
    rows = []
    for name, passed, secs, out in fuzz:
        if not name.startswith("fuzz_"):
            continue
        m = re.findall(r"stat::number_of_executed_units:\s*(\d+)", out) or re.findall(r"Done (\d+) runs", out)
        execs = int(m[-1]) if m else None
        arts = []
        if os.path.isdir(artifacts_dir):
            short = name[len("fuzz_"):]
            arts = [a for a in os.listdir(artifacts_dir) if a.startswith(short + "-")]
        crashes = len(arts) if arts else (0 if passed else 1)
        rows.append((name, "?" if execs is None else f"{execs:,}", f"{secs:.0f} s", crashes))
    return rows


# CTest fixtures that a sanitizer step pulls in (the TSan step's kube_e2e_informer brings the local cluster up and
# down): not tests of their own, but their time is the step's cost and their failure is the step's failure.
FIXTURE_TESTS = {"e2e_cluster_up", "e2e_cluster_down"}


def sanitizer_summary(label, cases):
    if cases is None:
        return f"| {label} | not run (no JUnit file) | | | |"
    failed = [n for n, ok, _, _ in cases if not ok]
    reports = {k: sum(len(p.findall(out)) for _, _, _, out in cases) for k, p in SANITIZER_PATTERNS.items()}
    found = ", ".join(f"{v} {k}" for k, v in reports.items() if v) or "none"
    secs = sum(s for _, _, s, _ in cases)
    tests = [c for c in cases if c[0] not in FIXTURE_TESTS]
    passed = sum(1 for _, ok, _, _ in tests if ok)
    return (f"| {label} | {len(tests)} | {passed} | {found}"
            f"{' (failed: ' + ', '.join(failed) + ')' if failed else ''} | {secs:.0f} s |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--fuzz-build", default="build-fuzz")
    ap.add_argument("--tsan-build", default="build-tsan")
    ap.add_argument("--out", default="docs/reliability.md")
    a = ap.parse_args()

    res = os.path.join(a.build, "hardening", "results")
    chaos = load_json(os.path.join(res, "chaos.json"))
    restarts = load_json(os.path.join(res, "restarts.json"))
    soak = load_json(os.path.join(res, "soak.json"))
    doors = load_json(os.path.join(res, "no_open_doors.json"))
    elastic = load_json(os.path.join(res, "elastic_chaos.json"))
    real = load_json(os.path.join(res, "real_nodes.json"))
    fuzz = load_junit(os.path.join(a.fuzz_build, "hardening", "fuzz.xml"))
    asan = load_junit(os.path.join(a.fuzz_build, "hardening", "asan.xml"))
    tsan = load_junit(os.path.join(a.tsan_build, "hardening", "tsan.xml"))

    dates = sorted(d["date"] for d in (chaos, restarts, soak, doors, elastic, real) if d)
    L = ["# Reliability (issue #13)", "",
         "Generated by `scripts/reliability_report.py` from the last test runs' outputs (the e2e tests' JSON results in "
         "`build/hardening/results/`, the JUnit files of `scripts/test.sh`'s hardening steps); do not edit by hand. "
         "How each fault is injected and what each test asserts: [hardening.md](hardening.md).", ""]
    if dates:
        L += [f"E2E results dated {dates[0]} to {dates[-1]}; machine: {os.uname().nodename} "
              f"({os.cpu_count()} cores).", ""]

    L += ["## Faults", "",
          "Jobs affected: jobs not yet finished while the fault was injected. Jobs correct: those that ended in the "
          "expected phase with the exact restart count and generation and no duplicate pod. Recovery: from the fault's "
          "end (network healed, component back) until a newly submitted job succeeded. The jobs of `e2e_chaos_operator` "
          "are shell commands, so no training steps exist to lose; the rows marked (real trainer) come from "
          "`e2e_elastic_chaos` (a training job; recovery there is from the fault to the first step of the new "
          "generation, and steps lost are measured). The other elastic e2e tests (`tests/e2e/elastic`) assert steps "
          "lost per flow but write no result file.", "",
          "| fault | injected | jobs affected | jobs correct | recovery | data lost (steps) | test |",
          "|---|---|---|---|---|---|---|"]
    rows = fault_rows(chaos, restarts, soak, elastic, real)
    L += [f"| {k} | {n} | {aff} | {ok} | {rec} | {lost} | {src} |" for k, n, aff, ok, rec, lost, src in rows]
    for name, d in (("e2e_chaos_operator", chaos), ("e2e_control_plane_restarts", restarts), ("e2e_soak", soak),
                    ("e2e_elastic_chaos", elastic), ("e2e_real_nodes", real)):
        if d is None:
            L.append(f"| `{name}`: not run (no result file) | | | | | | |")
    L.append("")

    if elastic:
        L += [f"`e2e_elastic_chaos`: {len(elastic['events'])} faults, restarts {elastic['restarts']} "
              f"(generations {elastic['generations']}), final loss {elastic['final_loss']:g} "
              f"{'equal to' if elastic.get('final_loss_equal') else 'DIFFERENT from'} the undisturbed run's, final "
              f"parameters {'bitwise equal' if elastic.get('params_bitwise_equal') else 'NOT equal'}; median step "
              f"{elastic['step_s_median']} s, goodput {elastic['goodput']} (steps x median step time / wall time from "
              f"the first step to Succeeded).", ""]

    L += ["## Soak", ""]
    if soak:
        L += ["| duration | rounds | jobs run | jobs correct | operator RSS start -> end | open fds start -> end |",
              "|---|---|---|---|---|---|",
              f"| {soak['soak_seconds']} s | {soak['rounds']} | {soak['jobs_run']} | {soak['jobs_correct']} | "
              f"{soak['rss_start_kib'] / 1024:.1f} -> {soak['rss_end_kib'] / 1024:.1f} MiB | "
              f"{soak['fds_start']} -> {soak['fds_end']} |", "",
              "Tolerances (why they are what they are: `tests/chaos/soak_test.sh`): fds may grow by at most 4, RSS by "
              "at most 20 % + 4 MiB between the first and the last third of the samples. CI runs 45 s; "
              "`RAILYARD_SOAK_SECONDS=3600 ctest -R e2e_soak` runs an hour.", ""]
    else:
        L += ["Not run (no `soak.json`).", ""]

    L += ["## Fuzzers", ""]
    if fuzz is None:
        L += ["Not run (no `hardening/fuzz.xml` in the fuzz build; run `scripts/test.sh --hardening-only`).", ""]
    else:
        fr = fuzz_rows(fuzz, os.path.join(a.fuzz_build, "tests", "fuzz", "artifacts"))
        L += ["| fuzzer | executions | time | crashes |", "|---|---|---|---|"]
        L += [f"| `{n}` | {e} | {t} | {c} |" for n, e, t, c in fr]
        L += ["", f"Total: {len(fr)} fuzzers, {sum(c for *_, c in fr)} crashes.", ""]

    L += ["## Sanitizers", "",
          "| run | tests | passed | sanitizer reports | time |", "|---|---|---|---|---|",
          sanitizer_summary("ASan + UBSan (unit tests, `build-fuzz`)", asan),
          sanitizer_summary("TSan (concurrency tests, `build-tsan`)", tsan), ""]

    L += ["## No open doors", ""]
    if doors:
        L += [f"`e2e_no_open_doors` ({doors['seconds']} s): the rendezvous service refused "
              f"{doors['rendezvous_refusals']} bad requests (no token, Basic auth, wrong token, another job's token, "
              f"a truncated token, an unknown job answered exactly like a wrong token) and the monitor's webhook {doors['webhook_refusals']} (no token, wrong token, a job's "
              f"rendezvous token, a prefix of its token), none echoing a token; {doors['tokens_checked']} secret values "
              f"were absent from {doors['files_scanned']} files (operator/monitor/node-agent logs at debug level, "
              f"{doors['pod_logs']} pod logs, {doors['metrics_endpoints']} `/metrics` outputs, the pods, TrainingJobs "
              f"and events as JSON); an operator given a wrong CA "
              f"{'was refused by TLS verification' if doors['wrong_ca_refused'] else 'was NOT refused'}"
              + (f"; {doors['secure_pods']} worker pods carried the secure defaults (non-root, read-only root, no "
                 f"privilege escalation, capabilities dropped)" if "secure_pods" in doors else "")
              + ("; a job whose data path left `--data-root` was Invalid"
                 if doors.get("path_outside_root_refused") else "") + ".", ""]
    else:
        L += ["Not run (no `no_open_doors.json`).", ""]

    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        f.write("\n".join(L).rstrip("\n") + "\n")
    print(f"reliability_report: wrote {a.out} ({len(rows)} fault rows)", file=sys.stderr)


if __name__ == "__main__":
    main()
