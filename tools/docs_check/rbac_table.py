#!/usr/bin/env python3
"""docs/install.md's RBAC table against deploy/rbac/: the same verbs on the same resources, for each component.

Per component (operator, monitor) and per (API group, resource), the union of the verbs the table lists must equal the
union of the verbs every Role and ClusterRole bound to that component's ServiceAccount grants. A rule the table does
not show, a row the manifests do not grant, or a verb more or less on either side fails with the difference named.
Exit 0 when they agree. Run by ctest as docs_rbac_table (label unit); `--self-test` checks that a changed verb fails.
"""
import pathlib
import re
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMPONENTS = {"operator": "railyard-operator", "monitor": "railyard-monitor"}


def granted(rbac_dir):
    """{component: {(group, resource): set(verbs)}} from the manifests, through the (Cluster)RoleBindings."""
    docs = []
    for f in sorted(rbac_dir.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d]
    roles = {(d["kind"], d["metadata"]["name"]): d.get("rules", []) for d in docs if d["kind"] in ("Role", "ClusterRole")}
    out = {c: {} for c in COMPONENTS}
    for d in docs:
        if d["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        for s in d.get("subjects", []):
            for comp, sa in COMPONENTS.items():
                if s.get("kind") == "ServiceAccount" and s.get("name") == sa:
                    for rule in roles.get((d["roleRef"]["kind"], d["roleRef"]["name"]), []):
                        for g in rule.get("apiGroups", []):
                            for r in rule.get("resources", []):
                                out[comp].setdefault((g, r), set()).update(rule.get("verbs", []))
    return out


def documented(md_text):
    """{component: {(group, resource): set(verbs)}} from the table whose header is | who | API group | resource |..."""
    out = {c: {} for c in COMPONENTS}
    lines = md_text.splitlines()
    start = next(i for i, l in enumerate(lines) if re.match(r"\|\s*who\s*\|\s*API group\s*\|\s*resource\s*\|", l))
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        who, group, resource, verbs = cells[0], cells[1], cells[2], cells[3]
        if who not in out:
            continue  # workers: no rights
        g = re.findall(r"`([^`]*)`", group)
        r = re.findall(r"`([^`]*)`", resource)
        if not g or not r:
            raise SystemExit(f"docs/install.md RBAC row without a backquoted group and resource: {line}")
        core = "" if g[0] == '""' else g[0]  # the core group is written `""`
        out[who].setdefault((core, r[0]), set()).update(v.strip() for v in verbs.split(",") if v.strip())
    return out


def compare(doc, grant):
    problems = []
    for comp in COMPONENTS:
        for key in sorted(set(doc[comp]) | set(grant[comp])):
            d, g = doc[comp].get(key, set()), grant[comp].get(key, set())
            if d != g:
                name = f"{comp}: {key[0] or 'core'}/{key[1]}"
                problems.append(f"{name}: docs/install.md lists [{', '.join(sorted(d))}], deploy/rbac/ grants "
                                f"[{', '.join(sorted(g))}]")
    return problems


def main():
    md = (ROOT / "docs/install.md").read_text()
    problems = compare(documented(md), granted(ROOT / "deploy/rbac"))
    if "--self-test" in sys.argv:
        # The check bites: one verb less in the table is a difference naming that resource.
        changed = md.replace("| `nodes` | get, list, watch |", "| `nodes` | get, list |", 1)
        assert changed != md, "self-test: the nodes row was not found"
        found = compare(documented(changed), granted(ROOT / "deploy/rbac"))
        assert any("core/nodes" in p for p in found), found
    if problems:
        print("docs/install.md's RBAC table disagrees with deploy/rbac/ (fix the table or the manifests):")
        print("\n".join("  " + p for p in problems))
        return 1
    print(f"docs/install.md's RBAC table agrees with deploy/rbac/ "
          f"({sum(len(v) for v in documented(md).values())} resources)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
