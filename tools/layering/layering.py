#!/usr/bin/env python3
"""The include structure of the C++ sources (issue 42 item 6): exits 1 naming every break of

- no include loop: with a header and its .cc as one unit (a.h + a.cc), no unit reaches itself through includes;
- layers inside worker/ depend only downward: a folder includes only folders of a lower rank (WORKER_RANKS);
- layers inside operator/: api.h below everything, then rendezvous/, scheduler/, controller/, then main.cc and flags;
- components: common/ includes only common/; checkpoint/, planner/, monitor/ and worker/ include nothing of
  operator/ or cli/ (the planner sits beside the operator, not under it; the monitor reads the spec through common/).

Usage: layering.py [SOURCE_ROOT]
"""
import collections
import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
DIRS = ["operator", "worker", "monitor", "cli", "common", "planner", "checkpoint", "deploy/local/node_agent", "tools"]
EXTS = (".h", ".cc", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')

# Lower ranks are lower layers; a folder may include its own files and folders of a strictly lower rank.
WORKER_RANKS = {
    "data": 0, "kernels/cpu": 0, "device": 1, "comm": 2, "model": 2, "kernels/cuda": 3, "optim": 3, "interop": 3,
    "parallel": 4, "train": 5, "agent": 5, "cmd": 6, ".": 7,
}
OPERATOR_RANKS = {"api.h": 0, "rendezvous": 1, "scheduler": 2, "controller": 3, ".": 4}
COMPONENT_BANS = {
    "common": ("operator/", "worker/", "monitor/", "cli/", "planner/", "checkpoint/", "deploy/"),
    "checkpoint": ("operator/", "cli/", "monitor/"),
    "planner": ("operator/", "cli/", "monitor/", "worker/"),
    "monitor": ("operator/", "cli/", "worker/"),
    "worker": ("operator/", "cli/", "monitor/"),
}

problems = []


def sources():
    for d in DIRS:
        for dirpath, dirnames, files in os.walk(os.path.join(ROOT, d)):
            dirnames[:] = [x for x in dirnames if not x.startswith("build")]
            for f in files:
                if f.endswith(EXTS):
                    yield os.path.relpath(os.path.join(dirpath, f), ROOT)


def includes(rel):
    with open(os.path.join(ROOT, rel), errors="replace") as f:
        for n, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if m and os.path.exists(os.path.join(ROOT, m.group(1))):
                yield n, m.group(1)


def folder(path, top, ranks):
    """The folder of `path` under `top` as the ranks name it ("." for files directly in top)."""
    rest = path[len(top) + 1:]
    parts = rest.split("/")
    if len(parts) == 1:
        return parts[0] if parts[0] in ranks else "."
    if parts[0] == "kernels" and len(parts) > 2:
        return "kernels/" + parts[1]
    return parts[0]


edges = collections.defaultdict(set)
for rel in sources():
    unit = os.path.splitext(rel)[0]
    for n, inc in includes(rel):
        target = os.path.splitext(inc)[0]
        if target != unit:
            edges[unit].add(target)
        for top, ranks in (("worker", WORKER_RANKS), ("operator", OPERATOR_RANKS)):
            if rel.startswith(top + "/") and inc.startswith(top + "/"):
                a, b = folder(rel, top, ranks), folder(inc, top, ranks)
                if a not in ranks or b not in ranks:
                    problems.append(f"{rel}:{n}: {top}/ folder {a if a not in ranks else b} has no layer: add it to "
                                    f"{'WORKER_RANKS' if top == 'worker' else 'OPERATOR_RANKS'}")
                elif a != b and ranks[b] >= ranks[a]:
                    problems.append(f"{rel}:{n}: includes {inc}: {top}/{b} is not below {top}/{a}")
        comp = rel.split("/")[0]
        for banned in COMPONENT_BANS.get(comp, ()):
            if inc.startswith(banned):
                problems.append(f"{rel}:{n}: includes {inc}: {comp}/ must not depend on {banned}")

# Include loops: strongly connected components of more than one unit (iterative Tarjan).
index, low, on_stack, stack, counter = {}, {}, set(), [], [0]
for start in sorted(edges):
    if start in index:
        continue
    work = [(start, iter(sorted(edges.get(start, ()))))]
    index[start] = low[start] = counter[0]
    counter[0] += 1
    stack.append(start)
    on_stack.add(start)
    while work:
        v, it = work[-1]
        advanced = False
        for w in it:
            if w not in index:
                index[w] = low[w] = counter[0]
                counter[0] += 1
                stack.append(w)
                on_stack.add(w)
                work.append((w, iter(sorted(edges.get(w, ())))))
                advanced = True
                break
            if w in on_stack:
                low[v] = min(low[v], index[w])
        if advanced:
            continue
        work.pop()
        if work:
            low[work[-1][0]] = min(low[work[-1][0]], low[v])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                problems.append("include loop: " + " -> ".join(sorted(comp)) + " (each reaches the others)")

for p in problems:
    print("layering:", p)
print(f"layering: {len(edges)} units, {len(problems)} problem(s)")
sys.exit(1 if problems else 0)
