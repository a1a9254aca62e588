#!/usr/bin/env python3
"""Flash checkpoints against torch.save (docs/benchmarks.md "Flash checkpoints"): run by hand on a quiet machine.

    /usr/bin/python3 tests/bench/program/flash_bench.py --model example --rounds 5
    /usr/bin/python3 tests/bench/program/flash_bench.py --model 355m --rounds 3 --dir /var/tmp/flash-bench

Per round, in alternating order (flash first in odd rounds, torch.save first in even ones):
  - flash: Checkpoint.save() of the model's and AdamW's state_dict, what it blocks the training loop for (the copy into
    shared memory), then how long the background checksum and write to --dir take (wait());
  - torch.save: the same state to a file in --dir, flushed and fsynced (what a durable save blocks for);
  - restore: Checkpoint.load() from memory (a restarted process), from the flash file on disk, and torch.load of the
    torch.save file, each followed by load_state_dict into a fresh model and optimizer.
Prints the machine (CPU, flags that matter, cores, memory), the load average before and after, every round, and
medians with min-max spreads. The model is the example's GPT (deploy/examples/pytorch/train_gpt.py): "example" is the
shipped size, "355m" 20 layers of width 1024, vocabulary 50304, context 1024 (355 M parameters, 4.3 GB of state with
AdamW's moments).
"""
import argparse
import os
import platform
import shutil
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(SRC, "worker", "agent", "python"))
sys.path.insert(0, os.path.join(SRC, "deploy", "examples", "pytorch"))

import torch  # noqa: E402
from railyard_flash import Checkpoint  # noqa: E402
from train_gpt import GPT  # noqa: E402

SIZES = {"example": dict(vocab=256, c=64, layers=2, heads=4, block=64),
         "355m": dict(vocab=50304, c=1024, layers=20, heads=16, block=1024)}


def machine():
    cpu, flags = "?", set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and cpu == "?":
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    want = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile", "sse4_2") if f in flags]
    return f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB, flags {' '.join(want)}, torch {torch.__version__}, " \
           f"python {platform.python_version()}"


def build(size):
    torch.manual_seed(0)
    s = SIZES[size]
    model = GPT(s["vocab"], s["c"], s["layers"], s["heads"], s["block"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():  # AdamW's moments exist after one step: a state_dict as large as in training
        p.grad = torch.full_like(p, 1e-3)
    opt.step()
    for p in model.parameters():
        p.grad = None
    return model, opt


def med(xs):
    return f"{statistics.median(xs):.3f} s ({min(xs):.3f}-{max(xs):.3f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(SIZES), default="example")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/railyard-flash-bench")
    a = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    print(f"date {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; {machine()}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    prefix = f"/railyard-flashbench-{os.getpid()}"
    os.environ["RAILYARD_SHM_PREFIX"] = prefix
    model, opt = build(a.model)
    n = sum(p.numel() for p in model.parameters())
    state_bytes = sum(t.numel() * t.element_size() for t in list(model.state_dict().values()) +
                      [v for st in opt.state_dict()["state"].values() for v in st.values() if torch.is_tensor(v)])
    print(f"model {a.model}: {n / 1e6:.1f} M parameters, state (params + AdamW moments + buffers) "
          f"{state_bytes / 2**30:.2f} GiB")
    objs = {"model": model, "opt": opt}
    ck = Checkpoint(replicated=True, directory=a.dir, memory_every=1, disk_every=1, keep=1)
    r = {k: [] for k in ("flash_blocked", "flash_background", "torch_save", "load_memory", "load_disk", "torch_load")}
    torch_file = os.path.join(a.dir, "ckpt.pt")
    # The first save into each of the two slots pays for fresh shared-memory pages (page faults: on the VM of the
    # recorded runs 2.4 s per GiB, against 0.04 s per GiB for a copy into touched pages); training saves into them
    # again and again, so the rounds below measure the steady state, and the warm-up is printed on its own.
    cold = []
    for w in (-2, -1):
        t0 = time.perf_counter()
        ck.save(w, objs, force=True)
        cold.append(time.perf_counter() - t0)
        ck.wait()
    print(f"warm-up: the first save into each slot blocked {cold[0]:.3f} s and {cold[1]:.3f} s", flush=True)
    for i in range(1, a.rounds + 1):
        def flash():
            t0 = time.perf_counter()
            ck.save(i, objs)
            t1 = time.perf_counter()
            ck.wait()
            r["flash_blocked"].append(t1 - t0)
            r["flash_background"].append(time.perf_counter() - t1)

        def tsave():
            t0 = time.perf_counter()
            with open(torch_file + ".tmp", "wb") as f:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": i}, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(torch_file + ".tmp", torch_file)
            r["torch_save"].append(time.perf_counter() - t0)

        for fn in ((flash, tsave) if i % 2 else (tsave, flash)):
            fn()
        # Restores into the same objects (a fresh model of this size would double the memory); load_state_dict copies.
        for kind in ("memory", "disk"):
            # A new pod has nothing in memory: another segment prefix (the saving slots stay mapped, as in training).
            os.environ["RAILYARD_SHM_PREFIX"] = prefix if kind == "memory" else prefix + "-newpod"
            os.environ["RAILYARD_GENERATION"] = "2"
            t0 = time.perf_counter()
            c2 = Checkpoint(replicated=True, directory=a.dir, memory_every=0, disk_every=0)
            step = c2.load(objs)
            r["load_" + kind].append(time.perf_counter() - t0)
            assert step == i and c2.restored_from == kind, (step, c2.restored_from)
            c2.close()
        os.environ["RAILYARD_SHM_PREFIX"] = prefix
        t0 = time.perf_counter()
        st = torch.load(torch_file, map_location="cpu")
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        del st
        r["torch_load"].append(time.perf_counter() - t0)
        print(f"round {i}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in r.items()), flush=True)
    ck.close()
    for s in ck.slots:
        if os.path.exists(s.path):
            os.remove(s.path)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("median (min-max) over", a.rounds, "rounds:")
    for k, v in r.items():
        print(f"  {k:17s} {med(v)}")
    print(f"  training blocked per save: flash {statistics.median(r['flash_blocked']):.3f} s vs torch.save "
          f"{statistics.median(r['torch_save']):.3f} s ({statistics.median(r['torch_save']) / statistics.median(r['flash_blocked']):.1f}x)")
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
