#!/usr/bin/python3
"""PyTorch CPU baseline for tests/bench/worker/train_vs_torch.sh: the same GPT (tests/reference/gpt_reference.py's
functional forward: fp32, tanh GELU, tied head), the same shapes, AdamW (betas 0.9/0.95, eps 1e-8, decay 0.1 on 2-D
weights), global-norm clipping at 1.0, GPT-2 init (normal 0.02). Prints one JSON line with per-step times."""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "reference"))
from gpt_reference import NAMES, DECAY, shapes, forward  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=12)
ap.add_argument("--channels", type=int, default=768)
ap.add_argument("--heads", type=int, default=12)
ap.add_argument("--max-seq", type=int, default=1024)
ap.add_argument("--vocab", type=int, default=50257)
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--seq", type=int, default=64)
ap.add_argument("--steps", type=int, default=6)
ap.add_argument("--threads", type=int, default=2)
a = ap.parse_args()

torch.set_num_threads(a.threads)
torch.manual_seed(0)
c = {"L": a.layers, "C": a.channels, "NH": a.heads, "maxT": a.max_seq, "V": a.vocab,
     "Vp": (a.vocab + 127) // 128 * 128}
P = {}
for name, shp in zip(NAMES, shapes(c)):
    if name in ("ln1w", "ln2w", "lnfw"):
        t = torch.ones(shp)
    elif name in DECAY:
        std = 0.02 / math.sqrt(2 * a.layers) if name in ("attprojw", "fcprojw") else 0.02
        t = torch.randn(shp) * std
    else:
        t = torch.zeros(shp)
    P[name] = t.requires_grad_(True)
params = [P[n] for n in NAMES]
opt = torch.optim.AdamW(
    [{"params": [P[n] for n in NAMES if n in DECAY], "weight_decay": 0.1},
     {"params": [P[n] for n in NAMES if n not in DECAY], "weight_decay": 0.0}],
    lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
rng = np.random.default_rng(0)
times, cpu, losses = [], [], []
for step in range(a.steps):
    tok = torch.from_numpy(rng.integers(0, 256, size=(a.batch, a.seq + 1)).astype(np.int64))
    t0, c0 = time.perf_counter(), time.process_time()
    opt.zero_grad(set_to_none=True)
    _, loss = forward(P, tok[:, :-1], tok[:, 1:], c)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    times.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
    losses.append(loss.item())
print(json.dumps({"impl": "torch", "torch": torch.__version__, "threads": torch.get_num_threads(),
                  "step_seconds": times, "cpu_seconds": cpu, "losses": losses}))
