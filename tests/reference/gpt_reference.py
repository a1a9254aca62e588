#!/usr/bin/python3
"""PyTorch reference for Railyard's CPU GPT (tests/unit/worker/test_gpt_reference.cc).

Usage: /usr/bin/python3 tests/reference/gpt_reference.py DIR

Reads from DIR (written by the C++ test):
  config.json   model shape (L, C, NH, maxT, V, Vp), batch (B, T) and the optimizer settings
  params.bin    float32 flat parameters in gpt_config.h order (wte is (Vp, C), padded rows included)
  inputs.bin, targets.bin   int32 (B, T)
Writes to DIR:
  logits.bin    float32 (B, T, V) of the initial parameters
  grads.bin     float32 flat gradients of the mean loss, same layout as params.bin
  result.json   {"loss": ..., "losses": [10 training losses]}

The model is built from torch's functional ops (fp32, tanh GELU, LM head tied to wte); training uses
torch.optim.AdamW with the same decay groups, warmup + cosine schedule and clip_grad_norm_.
"""
import json
import math
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # the C++ test turns this exit code into a clear failure
    print(f"gpt_reference.py: {e}: install python3-torch and python3-numpy "
          "(scripts/install-deps.sh --with-torch) and run with /usr/bin/python3", file=sys.stderr)
    sys.exit(77)

NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
         "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
DECAY = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}


def shapes(c):
    L, C, T, Vp = c["L"], c["C"], c["maxT"], c["Vp"]
    return [(Vp, C), (T, C), (L, C), (L, C), (L, 3 * C, C), (L, 3 * C), (L, C, C), (L, C),
            (L, C), (L, C), (L, 4 * C, C), (L, 4 * C), (L, C, 4 * C), (L, C), (C,), (C,)]


def forward(P, idx, targets, c):
    L, C, NH, V = c["L"], c["C"], c["NH"], c["V"]
    B, T = idx.shape
    hs = C // NH
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    x = P["wte"][idx] + P["wpe"][:T]
    for l in range(L):
        h = F.layer_norm(x, (C,), P["ln1w"][l], P["ln1b"][l], 1e-5)
        qkv = h @ P["qkvw"][l].T + P["qkvb"][l]
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + y @ P["attprojw"][l].T + P["attprojb"][l]
        h = F.layer_norm(x, (C,), P["ln2w"][l], P["ln2b"][l], 1e-5)
        h = F.gelu(h @ P["fcw"][l].T + P["fcb"][l], approximate="tanh")
        x = x + h @ P["fcprojw"][l].T + P["fcprojb"][l]
    x = F.layer_norm(x, (C,), P["lnfw"], P["lnfb"], 1e-5)
    logits = (x @ P["wte"].T)[..., :V]  # tied head; padded vocab rows never predicted
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    return logits, loss


def lr_at(step, c):
    lr, warm, total, frac = c["lr"], c["warmup"], c["steps"], c["min_lr_frac"]
    if warm > 0 and step < warm:
        return lr * (step + 1) / warm
    lo = lr * frac
    r = min(1.0, max(0.0, (step - warm) / max(1, total - warm)))
    return lo + 0.5 * (1.0 + math.cos(math.pi * r)) * (lr - lo)


def main():
    d = sys.argv[1]
    torch.set_num_threads(1)
    c = json.load(open(f"{d}/config.json"))
    flat = np.fromfile(f"{d}/params.bin", dtype=np.float32)
    B, T = c["B"], c["T"]
    idx = torch.from_numpy(np.fromfile(f"{d}/inputs.bin", dtype=np.int32).astype(np.int64).reshape(B, T))
    tgt = torch.from_numpy(np.fromfile(f"{d}/targets.bin", dtype=np.int32).astype(np.int64).reshape(B, T))
    P, off = {}, 0
    for name, shp in zip(NAMES, shapes(c)):
        n = int(np.prod(shp))
        P[name] = torch.tensor(flat[off:off + n].reshape(shp), requires_grad=True)
        off += n
    assert off == flat.size, f"params.bin has {flat.size} floats, the config needs {off}"

    logits, loss = forward(P, idx, tgt, c)
    loss.backward()
    logits.detach().numpy().astype(np.float32).tofile(f"{d}/logits.bin")
    np.concatenate([P[n].grad.numpy().reshape(-1) for n in NAMES]).astype(np.float32).tofile(f"{d}/grads.bin")
    first_loss = loss.item()

    for p in P.values():
        p.grad = None
    params = [P[n] for n in NAMES]
    opt = torch.optim.AdamW(
        [{"params": [P[n] for n in NAMES if n in DECAY], "weight_decay": c["weight_decay"]},
         {"params": [P[n] for n in NAMES if n not in DECAY], "weight_decay": 0.0}],
        lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"])
    losses = []
    for step in range(c["steps"]):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, c)
        opt.zero_grad(set_to_none=True)
        _, loss = forward(P, idx, tgt, c)
        loss.backward()
        if c["grad_clip"] > 0:
            torch.nn.utils.clip_grad_norm_(params, c["grad_clip"])
        opt.step()
        losses.append(loss.item())
    json.dump({"loss": first_loss, "losses": losses, "torch": torch.__version__}, open(f"{d}/result.json", "w"))


if __name__ == "__main__":
    main()
