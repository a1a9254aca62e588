#!/usr/bin/env python3
"""Checks the two cross-process name contracts of common/ (issue 42 item 5):

- metrics: every metric is defined once, with its type, in common/metrics/names.h; C++ code outside that file uses
  the constants (no "railyard_<area>_..." literal); the recording and alert rules, dashboards, chart, docs and scripts
  name only defined metrics, take _bucket/_sum/_count only of histograms, and rate()/increase() only of counters and
  a histogram's series.
- environment: every RAILYARD_* variable name is a constant in common/ (pod_env.h or beside its contract), defined
  once; C++ code elsewhere uses the constant (no "RAILYARD_..." literal); every RAILYARD_* name in the C++ sources,
  docs, chart, deploy files and Python helpers is one of them, except the test scripts' own shell variables
  (HARNESS_VARS below).

Usage: contracts.py [SOURCE_DIR]. Prints each problem as FILE:LINE: what, and exits 1 when there is one.
"""
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
NAMES_H = "common/metrics/names.h"
CPP_DIRS = ["operator", "worker", "monitor", "cli", "common", "planner", "checkpoint", "tools"]
# Where metric names are read: rules, dashboards, chart, docs, scripts, module READMEs.
TEXT_DIRS = ["deploy", "charts", "docs", "worker/agent/python", "scripts", "README.md", "monitor", "operator",
             "worker", "cli", "common"]
TEXT_EXT = (".md", ".yaml", ".yml", ".json", ".py", ".sh", ".tpl")
# Where the pod environment is described to users or read by our Python helpers (the test and build scripts have
# their own RAILYARD_* shell variables and CMake options, which are not the pod's environment).
ENV_TEXT = ["docs/programs.md", "docs/operator.md", "docs/monitor.md", "worker/agent/python", "deploy/examples",
            "charts"]
METRIC_TOKEN = re.compile(r"\b((?:railyard_(?:worker|checkpoint|agent|operator|monitor)_|workqueue_|"
                          r"controller_runtime_)[a-z0-9_]*[a-z0-9])\b")
ENV_TOKEN = re.compile(r"\bRAILYARD_[A-Z0-9_]*[A-Z0-9]\b")

problems = []


def problem(path, line, what):
    problems.append(f"{os.path.relpath(path, ROOT)}:{line}: {what}")


def walk(entries, exts):
    for e in entries:
        p = os.path.join(ROOT, e)
        if os.path.isfile(p):
            yield p
            continue
        for d, dirs, files in os.walk(p):
            # build trees (build/, build-fuzz/, build-tsan/) hold generated CMake files and copies, not sources
            dirs[:] = [x for x in dirs if not x.startswith("build") and x not in ("node_modules", "__pycache__", ".git")]
            for f in sorted(files):
                if f.endswith(exts):
                    yield os.path.join(d, f)


def lines(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read().split("\n")


# --- The metric catalog.
metrics = {}  # name -> type
consts = []
names_path = os.path.join(ROOT, NAMES_H)
names_text = "\n".join(lines(names_path))
for n, line in enumerate(lines(names_path), 1):
    m = re.search(r"inline constexpr (Counter|Gauge|Histogram)Name (k\w+)\{\"([^\"]+)\"\}", line)
    if not m:
        continue
    kind, const, name = m.group(1).lower(), m.group(2), m.group(3)
    if name in metrics:
        problem(names_path, n, f"metric {name} defined twice ({metrics[name]} and {kind}): one name, one type")
    metrics[name] = kind
    consts.append(const)
listed = re.findall(r"any\((k\w+)\)", names_text)
for c in consts:
    if listed.count(c) != 1:
        problem(names_path, 0, f"{c} appears {listed.count(c)} times in kAll (want once)")
for c in listed:
    if c not in consts:
        problem(names_path, 0, f"kAll lists {c}, which is not defined here")
if len(metrics) < 40:
    problem(names_path, 0, f"only {len(metrics)} metrics parsed: the catalog's format changed, fix this checker")
for name, kind in metrics.items():
    for suffix in ("_sum", "_count", "_bucket"):
        if name + suffix in metrics:
            problem(names_path, 0, f"{name + suffix} collides with the {suffix} series of {name}")

# --- The environment names.
envs = {}  # name -> file
for path in walk(["common"], (".h",)):
    for n, line in enumerate(lines(path), 1):
        m = re.search(r"inline constexpr const char\* k\w+ = \"(RAILYARD_[A-Z0-9_]+)\"", line)
        if m:
            if m.group(1) in envs:
                problem(path, n, f"{m.group(1)} defined twice (also in {envs[m.group(1)]})")
            envs[m.group(1)] = os.path.relpath(path, ROOT)
if len(envs) < 40:
    problem(os.path.join(ROOT, "common/pod_env.h"), 0, f"only {len(envs)} environment names parsed: fix this checker")
# The world in torch.distributed's names (RANK, WORLD_SIZE, ...): constants of common/pod_env.h too.
world_envs = {}
for n, line in enumerate(lines(os.path.join(ROOT, "common/pod_env.h")), 1):
    m = re.search(r"inline constexpr const char\* k\w+ = \"([A-Z_]+)\"", line)
    if m and not m.group(1).startswith("RAILYARD_"):
        world_envs[m.group(1)] = "common/pod_env.h"
for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
    if name not in world_envs:
        problem(os.path.join(ROOT, "common/pod_env.h"), 0, f"{name} is not defined as a constant")


# CMake targets (railyard_worker_data, ...) share the metrics' prefixes and CMake options (RAILYARD_CUDA) the
# environment's: neither is a metric or a variable, though a message may name an option.
targets, options = set(), set()
for path in walk(["."], ("CMakeLists.txt", ".cmake")):
    text = "\n".join(lines(path))
    targets.update(re.findall(r"\b(?:railyard_library|railyard_test|add_library|add_executable|add_custom_target)\(\s*"
                              r"([A-Za-z0-9_]+)", text))
    options.update(re.findall(r"\b(?:option|set)\(\s*(RAILYARD_[A-Z0-9_]+)", text))


def resolve_metric(token):
    """The problem with a metric token, or None."""
    if token in metrics or token in targets:
        return None
    for suffix in ("_bucket", "_sum", "_count"):
        if token.endswith(suffix) and token[: -len(suffix)] in metrics:
            base = token[: -len(suffix)]
            if metrics[base] != "histogram":
                return f"{token}: {base} is a {metrics[base]}, not a histogram"
            return None
    # A prefix of family names, as in a regular expression (railyard_worker_(step|loss)) or a glob: fine when some
    # name starts with it.
    if token.endswith("_") or any(n.startswith(token + "_") for n in metrics):
        return None
    return f"{token} is not a metric of {NAMES_H}"


# --- C++ sources.
for path in walk(CPP_DIRS, (".cc", ".h", ".cu", ".cuh")):
    rel = os.path.relpath(path, ROOT)
    for n, line in enumerate(lines(path), 1):
        for lit in re.findall(r"\"(RAILYARD_[A-Z0-9_]+)\"", line):
            if not re.search(r"inline constexpr const char\* k\w+ = \"" + lit + "\"", line) or not rel.startswith(
                    "common/"):
                hint = f"use the constant of {envs[lit]}" if lit in envs else "define it in common/pod_env.h"
                problem(path, n, f"\"{lit}\" literal: {hint}")
        if not rel.startswith("common/"):
            for lit in re.findall(r"\"([A-Z_]+)\"", line):
                if lit in world_envs:
                    problem(path, n, f"\"{lit}\" literal: use the constant of common/pod_env.h")
        for text in re.findall(r'"((?:[^"\\]|\\.)*)"', line):  # messages that name a variable
            for tok in ENV_TOKEN.findall(text):
                if tok not in envs and tok not in options:
                    problem(path, n, f"{tok} is not an environment name defined in common/")
        if rel != NAMES_H:
            for lit in re.findall(r"\"([a-z_][a-z0-9_]*)\"", line):
                if lit in metrics and lit != "up" or METRIC_TOKEN.fullmatch(lit):
                    problem(path, n, f"\"{lit}\" literal: use the constant of {NAMES_H}")
        for tok in METRIC_TOKEN.findall(line):
            why = resolve_metric(tok)
            if why:
                problem(path, n, why)

# --- Rules, dashboards, chart, docs, scripts, Python helpers.
RATE = re.compile(r"\b(?:rate|irate|increase)\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)")
seen = set()
for path in walk(TEXT_DIRS, TEXT_EXT):
    if path in seen or "/tests/" in path:
        continue
    seen.add(path)
    for n, line in enumerate(lines(path), 1):
        for tok in METRIC_TOKEN.findall(line):
            why = resolve_metric(tok)
            if why:
                problem(path, n, why)
        for tok in RATE.findall(line):
            if tok in metrics and metrics[tok] != "counter":
                problem(path, n, f"rate/increase of {tok}, a {metrics[tok]} (only counters and histogram series)")

for path in walk(ENV_TEXT, TEXT_EXT):
    for n, line in enumerate(lines(path), 1):
        for tok in ENV_TOKEN.findall(line):
            if tok not in envs:
                problem(path, n, f"{tok} is not an environment name defined in common/")

for p in problems:
    print(p)
print(f"contracts_check: {len(metrics)} metrics, {len(envs)} environment names, {len(problems)} problem(s)")
sys.exit(1 if problems else 0)
