#!/usr/bin/python3
"""PyTorch CPU baseline for tests/bench/worker/train_vs_torch.sh: the same GPT-2 written the way a PyTorch user
writes it (nanoGPT style: nn.Linear / nn.LayerNorm / nn.Embedding per layer, manual causal attention since torch
1.13 has no scaled_dot_product_attention, tanh GELU, LM head tied to wte), the same shapes, AdamW (betas 0.9/0.95,
eps 1e-8, decay 0.1 on 2-D weights only), clip_grad_norm_ 1.0, GPT-2 init (normal 0.02, residual projections
0.02/sqrt(2L)). Prints one JSON line with per-step wall and CPU times."""
import argparse
import json
import math
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

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


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.nh = NH
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.attproj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.nh))
        att = att.masked_fill(~mask[:T, :T], float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.attproj(y)
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, C, NH, maxT, Vp):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(Vp, C), nn.Embedding(maxT, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.lnf = nn.LayerNorm(C)
        self.register_buffer("mask", torch.tril(torch.ones(maxT, maxT, dtype=torch.bool)))
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith(("attproj.weight", "fcproj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets, V):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x, self.mask)
        logits = self.lnf(x) @ self.wte.weight.T  # tied head
        return F.cross_entropy(logits[..., :V].reshape(-1, V), targets.reshape(-1))


torch.set_num_threads(a.threads)
torch.manual_seed(0)
Vp = (a.vocab + 127) // 128 * 128
model = GPT(a.layers, a.channels, a.heads, a.max_seq, Vp)
decay = [p for p in model.parameters() if p.dim() == 2]
no_decay = [p for p in model.parameters() if p.dim() != 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                        lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
rng = np.random.default_rng(0)
times, cpu, losses = [], [], []
for step in range(a.steps):
    tok = torch.from_numpy(rng.integers(0, 256, size=(a.batch, a.seq + 1)).astype(np.int64))
    t0, c0 = time.perf_counter(), time.process_time()
    opt.zero_grad(set_to_none=True)
    loss = model(tok[:, :-1], tok[:, 1:], a.vocab)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    times.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
    losses.append(loss.item())
print(json.dumps({"impl": "torch", "torch": torch.__version__, "threads": torch.get_num_threads(),
                  "step_seconds": times, "cpu_seconds": cpu, "losses": losses}))
