#!/usr/bin/env python3
"""A small GPT in plain PyTorch, trained with DistributedDataParallel: the example of a job that brings its own
program (deploy/examples/pytorch-ddp.yaml, docs/programs.md).

Nothing in it is Railyard's: it reads what torchrun would give it (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT through init_process_group's env:// method) and, where present, three optional variables:
RAILYARD_CHECKPOINT_DIR (where to keep its checkpoint; default ./checkpoints), RAILYARD_CHECKPOINT_INTERVAL_STEPS
(how often; default 20) and RAILYARD_PROGRESS_DIR (progress-$LOCAL_RANK.json in it: a JSON object {"step", "loss",
"tokens_per_second", "compute_seconds"} after every step, which Railyard turns into the job's status and the monitor's
hang, straggler and non-finite-loss rules; RAILYARD_PROGRESS_FILE, the same path per rank, when only it is set). The
same script runs under Railyard's per-rank launcher, under a torchrun in the container (spec.program.launcher
torchrun) and under plain torchrun.

Data: characters of a text file (default: the GPL text every Debian image carries), batches drawn from a generator
seeded by (seed, step, rank), so a run resumed at step s sees the data an undisturbed run saw from s on. The global
batch is fixed (--global-batch sequences per step, split over the ranks), so a resized world trains the same recipe.
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

try:  # Railyard's agent puts its flash checkpoint module on PYTHONPATH (docs/programs.md "Flash checkpoints")
    from railyard_flash import Checkpoint
except ImportError:  # elsewhere (plain torchrun, a laptop): torch.save every RAILYARD_CHECKPOINT_INTERVAL_STEPS
    Checkpoint = None


class Block(nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.attn = nn.MultiheadAttention(c, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(c, 4 * c), nn.GELU(), nn.Linear(4 * c, c))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, c, layers, heads, block):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, c), nn.Embedding(block, c)
        self.blocks = nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(c), nn.Linear(c, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((block, block), float("-inf")), diagonal=1))

    def forward(self, idx):  # idx: (B, T) token ids -> logits (B, T, vocab)
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for b in self.blocks:
            x = b(x, self.mask[:t, :t])
        return self.head(self.ln(x))


def batch(data, step, rank, n, block, seed):
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    ix = torch.randint(len(data) - block - 1, (n,), generator=g)
    x = torch.stack([data[i:i + block] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block] for i in ix])
    return x, y


def write_progress(path, step, loss, tps, compute):
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"step": step, "loss": loss, "tokens_per_second": tps, "compute_seconds": compute}, f)
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=int(os.environ.get("RAILYARD_TOTAL_STEPS", "200")))
    p.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    p.add_argument("--global-batch", type=int, default=12)
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep per step (tests: a slower run)")
    p.add_argument("--no-progress", action="store_true", help="report no progress (tests: the monitor's silence rule)")
    p.add_argument("--straggle-rank", type=int, default=-1,
                   help="this rank's own work takes --straggle-seconds longer per step (tests: the straggler rule)")
    p.add_argument("--straggle-seconds", type=float, default=0.1)
    p.add_argument("--straggle-factor", type=float, default=0.0,
                   help="instead of --straggle-seconds: its own work takes this many times as long (a ratio that "
                        "holds however busy the host is)")
    p.add_argument("--straggle-generation", type=int, default=0,
                   help="straggle only in this generation of the job (RAILYARD_GENERATION); 0: in every one")
    p.add_argument("--no-flash", action="store_true", help="torch.save only, even where railyard_flash is available")
    a = p.parse_args()

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if backend == "nccl" else torch.device("cpu")
    if a.global_batch % world:
        raise SystemExit(f"--global-batch {a.global_batch} is not divisible by WORLD_SIZE {world}")

    text = open(a.text, "rb").read()
    data = torch.tensor(list(text), dtype=torch.long)
    torch.manual_seed(a.seed)
    model = GPT(256, 64, 2, 4, a.block).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    ckpt_dir = os.environ.get("RAILYARD_CHECKPOINT_DIR", "checkpoints")
    every = int(os.environ.get("RAILYARD_CHECKPOINT_INTERVAL_STEPS", "20"))
    ckpt = os.path.join(ckpt_dir, "ckpt.pt")
    start = 1
    # Flash checkpoints: every step (spec.checkpoint.memoryIntervalSteps) into the pod's shared memory, copied to a
    # peer pod, every intervalSteps to ckpt_dir/flash in the background; a restart resumes from memory (a process),
    # a peer's copy (a lost pod) or the disk (a resize), whichever is newest and held by every rank.
    flash = Checkpoint(replicated=True) if Checkpoint is not None and not a.no_flash else None
    if flash is not None:
        start = flash.load({"model": model, "opt": opt}) + 1
        if start > 1:
            print(f"resumed from {flash.restored_from} at step {start - 1} (restart "
                  f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}, world {world})", flush=True)
    elif os.path.exists(ckpt):
        state = torch.load(ckpt, map_location="cpu")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"] + 1
        print(f"resumed from {ckpt} at step {state['step']} (restart {os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}, "
              f"world {world})", flush=True)
    # No buffer broadcast in forward (the causal mask is a constant): the forward pass is this rank's own work only,
    # which makes its time the compute_seconds the straggler rule compares across ranks.
    ddp = DDP(model, broadcast_buffers=False)
    print(f"rank {rank}/{world} backend {backend} steps {start}..{a.steps}", flush=True)

    per_rank = a.global_batch // world
    # One file per local rank in RAILYARD_PROGRESS_DIR: the one way that works when a torchrun in the container starts
    # the ranks (they share its environment, so no RAILYARD_PROGRESS_FILE can be a rank's own).
    progress_dir = os.environ.get("RAILYARD_PROGRESS_DIR", "")
    progress = (os.path.join(progress_dir, f"progress-{os.environ.get('LOCAL_RANK', '0')}.json") if progress_dir
                else os.environ.get("RAILYARD_PROGRESS_FILE", ""))
    if a.no_progress:
        progress = ""
    compute = 0.0  # seconds of batch preparation and forward passes: no collective waits in them
    straggle = rank == a.straggle_rank and a.straggle_generation in (0, int(os.environ.get("RAILYARD_GENERATION", "1")))
    t_train = time.time()
    last_progress = 0.0
    for step in range(start, a.steps + 1):
        t0 = time.time()
        lr = a.lr * 0.5 * (1 + math.cos(math.pi * (step - 1) / a.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batch(data, step, rank, per_rank, a.block, a.seed)
        logits = ddp(x.to(device))
        loss = F.cross_entropy(logits.view(-1, 256), y.to(device).view(-1))
        if straggle:  # a slower device or a busy host: before the gradient exchange
            time.sleep(a.straggle_seconds if a.straggle_factor <= 0 else (a.straggle_factor - 1) * (time.time() - t0))
        compute += time.time() - t0
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        # The mean loss over the ranks: what every rank reports, so the job's status is the global batch's loss.
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean = mean.item() / world
        if flash is not None:  # before the step is reported: a step the job reported is held by every rank
            flash.save(step, {"model": model, "opt": opt})
        if a.step_sleep > 0:
            time.sleep(a.step_sleep)
        tps = per_rank * a.block / max(time.time() - t0, 1e-9)
        # At most every 0.2 s (the agent reads the file every 0.5 s), and always the last step (the final loss): a
        # file written every 13 ms step cost the step 3-5 % here (docs/benchmarks.md "Program launcher").
        if step == a.steps or time.time() - last_progress >= 0.2:
            write_progress(progress, step, mean, tps, compute)
            last_progress = time.time()
        if rank == 0:
            print(f"step {step}/{a.steps} loss {mean:.6f}", flush=True)
            if flash is None and (step % every == 0 or step == a.steps):
                os.makedirs(ckpt_dir, exist_ok=True)
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, ckpt + ".tmp")
                os.replace(ckpt + ".tmp", ckpt)  # a crash mid-save leaves the previous checkpoint
        if flash is None:
            dist.barrier()  # no rank runs ahead of rank 0's save: a restart resumes every rank from one step
    if flash is not None:
        flash.close()  # the last disk save, if one is under way
    if rank == 0 and a.steps >= start:
        n = a.steps - start + 1
        took = time.time() - t_train
        saves = f", {flash.stats['saves']} flash saves blocking {flash.stats['blocked_seconds'] / max(1, flash.stats['saves']) * 1000:.2f} ms each" if flash else ""
        print(f"trained steps {start}..{a.steps} in {took:.3f} s ({took / n * 1000:.2f} ms/step){saves}", flush=True)
    dist.destroy_process_group()
    # Leave without the interpreter's teardown: with torch 1.13 it can deadlock destroying DDP's gloo process group
    # (the main thread joins a gloo worker that waits for the GIL to free a tensor; seen once in ~30 runs here, a rank
    # spinning at exit forever). Everything is saved and flushed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
