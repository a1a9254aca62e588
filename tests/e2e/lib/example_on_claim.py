#!/usr/bin/env python3
"""example_on_claim.py FILE [CLAIM]: a deploy/examples/ job as the tests that bring their own data run it.

The examples ask for their own volume and data (spec.storage, spec.initializer: docs/storage.md), which the tests
that train them as shipped check. Tests that point the job at shards they prepared themselves (simulated nodes mount
nothing; some real-node flows read the files on the host) print the example without the two sections; with CLAIM,
the worker container mounts that claim where spec.storage would have put the job's own (its mountPath, /shared by
default), as the examples did before they could make a volume. Everything else is the example as shipped."""
import sys

import yaml

if len(sys.argv) not in (2, 3):
    sys.exit(__doc__)
with open(sys.argv[1]) as f:
    job = yaml.safe_load(f)
spec = job["spec"]
storage = spec.pop("storage", None) or {}
spec.pop("initializer", None)
if len(sys.argv) == 3:
    pod = spec.setdefault("template", {}).setdefault("spec", {})
    pod.setdefault("volumes", []).append({"name": "shared", "persistentVolumeClaim": {"claimName": sys.argv[2]}})
    containers = pod.setdefault("containers", [])
    worker = next((c for c in containers if c.get("name", "worker") == "worker"), None)
    if worker is None:
        worker = {"name": "worker"}
        containers.append(worker)
    worker.setdefault("volumeMounts", []).append({"name": "shared", "mountPath": storage.get("mountPath", "/shared")})
print(yaml.safe_dump(job, sort_keys=False), end="")
