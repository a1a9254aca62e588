#!/usr/bin/python3
"""An independent reader for `railyard model export --format hf` (tests/unit/worker_data/cli_export_test.cc).

Usage: /usr/bin/python3 tests/reference/hf_gpt2_check.py HF_DIR LLMC_FILE SHARD B T

Reads HF_DIR/model.safetensors by the safetensors format description (8-byte little-endian header length, JSON
header, raw data; written here from that description, not with the safetensors package, which this machine lacks)
and HF_DIR/config.json as transformers' GPT2Config, and checks:
  - the header: metadata format "pt", only F32 tensors, data_offsets tiling the data part exactly, 8-byte alignment;
  - the names and shapes GPT2LMHeadModel expects for n_layer/n_embd/n_positions/vocab_size, no more, no fewer;
  - every tensor against LLMC_FILE (llm.c's GPT-2 format, read here too): Conv1D weights are llm.c's transposed;
  - a forward pass written the way transformers' modeling_gpt2 computes it (Conv1D x @ W + b, gelu_new, tied
    lm_head), in float64, over the first B*T+1 tokens of SHARD (an llm.c token shard).
Prints JSON {"loss": mean cross-entropy, "tensors": count}. Exit 1 with a message on any mismatch.
"""
import json
import math
import struct
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"hf_gpt2_check.py: {e}: install python3-torch and python3-numpy and run with /usr/bin/python3",
          file=sys.stderr)
    sys.exit(77)


def fail(msg):
    print(f"hf_gpt2_check.py: {msg}", file=sys.stderr)
    sys.exit(1)


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    if (8 + n) % 8:
        fail(f"data part starts at byte {8 + n}, not 8-byte aligned")
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    spans = []
    tensors = {}
    for name, info in header.items():
        if info["dtype"] != "F32":
            fail(f"{name}: dtype {info['dtype']}")
        b, e = info["data_offsets"]
        count = int(np.prod(info["shape"])) if info["shape"] else 1
        if e - b != 4 * count:
            fail(f"{name}: {e - b} bytes for shape {info['shape']}")
        spans.append((b, e))
        tensors[name] = np.frombuffer(data[b:e], dtype="<f4").reshape(info["shape"])
    spans.sort()
    pos = 0
    for b, e in spans:
        if b != pos:
            fail(f"data_offsets leave a gap or overlap at byte {pos}")
        pos = e
    if pos != len(data):
        fail(f"data part has {len(data)} bytes, the tensors cover {pos}")
    return meta, tensors


def read_llmc(path):
    raw = open(path, "rb").read()
    h = np.frombuffer(raw[:1024], dtype="<i4")
    if h[0] != 20240326 or h[1] != 3:
        fail(f"{path}: not an fp32 llm.c model")
    maxT, V, L, NH, C, Vp = (int(x) for x in h[2:8])
    flat = np.frombuffer(raw[1024:], dtype="<f4")
    shapes = [("wte", (Vp, C)), ("wpe", (maxT, C)), ("ln1w", (L, C)), ("ln1b", (L, C)), ("qkvw", (L, 3 * C, C)),
              ("qkvb", (L, 3 * C)), ("attprojw", (L, C, C)), ("attprojb", (L, C)), ("ln2w", (L, C)),
              ("ln2b", (L, C)), ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)), ("fcprojw", (L, C, 4 * C)),
              ("fcprojb", (L, C)), ("lnfw", (C,)), ("lnfb", (C,))]
    P, off = {}, 0
    for name, shp in shapes:
        k = int(np.prod(shp))
        P[name] = flat[off:off + k].reshape(shp)
        off += k
    if off != flat.size:
        fail(f"{path}: {flat.size} floats, the header needs {off}")
    return dict(maxT=maxT, V=V, L=L, NH=NH, C=C), P


def main():
    hf_dir, llmc, shard, B, T = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    cfg = json.load(open(f"{hf_dir}/config.json"))
    if cfg.get("model_type") != "gpt2" or cfg.get("architectures") != ["GPT2LMHeadModel"]:
        fail(f"config.json is not a GPT2LMHeadModel config: {cfg}")
    if cfg.get("activation_function") != "gelu_new" or not cfg.get("tie_word_embeddings", True):
        fail("config.json: activation or embedding tying differs from the model's")
    L, C, NH, V, maxT = cfg["n_layer"], cfg["n_embd"], cfg["n_head"], cfg["vocab_size"], cfg["n_positions"]
    eps = cfg["layer_norm_epsilon"]
    meta, W = read_safetensors(f"{hf_dir}/model.safetensors")
    if meta.get("format") != "pt":
        fail(f"__metadata__ {meta}: transformers wants format 'pt'")

    want = {"wte.weight": (V, C), "wpe.weight": (maxT, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for i in range(L):
        h = f"h.{i}."
        want.update({h + "ln_1.weight": (C,), h + "ln_1.bias": (C,), h + "attn.c_attn.weight": (C, 3 * C),
                     h + "attn.c_attn.bias": (3 * C,), h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
                     h + "ln_2.weight": (C,), h + "ln_2.bias": (C,), h + "mlp.c_fc.weight": (C, 4 * C),
                     h + "mlp.c_fc.bias": (4 * C,), h + "mlp.c_proj.weight": (4 * C, C), h + "mlp.c_proj.bias": (C,)})
    if set(W) != set(want):
        fail(f"tensor names differ: missing {sorted(set(want) - set(W))}, extra {sorted(set(W) - set(want))}")
    for name, shp in want.items():
        if tuple(W[name].shape) != shp:
            fail(f"{name}: shape {W[name].shape}, GPT2LMHeadModel wants {shp}")

    # Every tensor against the llm.c file, value for value.
    lc, P = read_llmc(llmc)
    if (lc["L"], lc["C"], lc["NH"], lc["V"], lc["maxT"]) != (L, C, NH, V, maxT):
        fail(f"config.json {L, C, NH, V, maxT} differs from the llm.c header {lc}")
    pairs = [("wte.weight", P["wte"][:V]), ("wpe.weight", P["wpe"]), ("ln_f.weight", P["lnfw"]),
             ("ln_f.bias", P["lnfb"])]
    for i in range(L):
        h = f"h.{i}."
        pairs += [(h + "ln_1.weight", P["ln1w"][i]), (h + "ln_1.bias", P["ln1b"][i]),
                  (h + "attn.c_attn.weight", P["qkvw"][i].T), (h + "attn.c_attn.bias", P["qkvb"][i]),
                  (h + "attn.c_proj.weight", P["attprojw"][i].T), (h + "attn.c_proj.bias", P["attprojb"][i]),
                  (h + "ln_2.weight", P["ln2w"][i]), (h + "ln_2.bias", P["ln2b"][i]),
                  (h + "mlp.c_fc.weight", P["fcw"][i].T), (h + "mlp.c_fc.bias", P["fcb"][i]),
                  (h + "mlp.c_proj.weight", P["fcprojw"][i].T), (h + "mlp.c_proj.bias", P["fcprojb"][i])]
    for name, ref in pairs:
        if not np.array_equal(W[name], ref):
            fail(f"{name} differs from the llm.c file's tensor")

    # transformers' GPT-2 forward, in float64.
    t = {k: torch.from_numpy(v.astype(np.float64)) for k, v in W.items()}
    raw = open(shard, "rb").read()
    tokens = np.frombuffer(raw[1024:1024 + 2 * (B * T + 1)], dtype="<u2").astype(np.int64)
    idx = torch.from_numpy(tokens[:-1].reshape(B, T))
    tgt = torch.from_numpy(tokens[1:].reshape(B, T))
    hs = C // NH
    x = t["wte.weight"][idx] + t["wpe.weight"][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(L):
        h = f"h.{i}."
        a = F.layer_norm(x, (C,), t[h + "ln_1.weight"], t[h + "ln_1.bias"], eps)
        q, k, v = (a @ t[h + "attn.c_attn.weight"] + t[h + "attn.c_attn.bias"]).split(C, dim=2)
        q, k, v = (z.view(B, T, NH, hs).transpose(1, 2) for z in (q, k, v))
        att = ((q @ k.transpose(-1, -2)) / math.sqrt(hs)).masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ t[h + "attn.c_proj.weight"] + t[h + "attn.c_proj.bias"]
        m = F.layer_norm(x, (C,), t[h + "ln_2.weight"], t[h + "ln_2.bias"], eps)
        m = F.gelu(m @ t[h + "mlp.c_fc.weight"] + t[h + "mlp.c_fc.bias"], approximate="tanh")
        x = x + m @ t[h + "mlp.c_proj.weight"] + t[h + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (C,), t["ln_f.weight"], t["ln_f.bias"], eps)
    logits = x @ t["wte.weight"].T  # lm_head tied to wte
    loss = F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1)).item()
    print(json.dumps({"loss": loss, "tensors": len(W)}))


if __name__ == "__main__":
    main()
