#!/usr/bin/env python3
"""Loom's attention outputs against torch's scaled_dot_product_attention, on the GPU machine.

CudaAttention.MatchesTorchSdpaToLongContexts (tests/cuda/cuda_attention_test.cc) runs the
backend's default kernels on random bf16 Q/K/V, dumps each case, and calls

    python3 bench/cuda/sdpa_check.py CASES

CASES has a line per case: PREFIX CACHED NEW HEADS KV_HEADS HEAD_DIM, with PREFIX{q,k,v,out}.bin
raw bf16 (q and out [NEW][HEADS][HEAD_DIM], k and v [CACHED + NEW][KV_HEADS][HEAD_DIM] in
position order). Row i of the new tokens sees keys 0..CACHED + i.

The reference is SDPA's arithmetic in fp32 (matmul, mask, softmax, matmul; TF32 off). The
yardstick is torch's own bf16 SDPA on the same inputs: a case passes when Loom's NMSE is at most
4x bf16 SDPA's (+1e-8) and its largest error at most 4x SDPA's (+1e-3). Prints a JSON line per
case; exits 1 if any fails, 0 otherwise.
"""
import json
import sys

import torch
import torch.nn.functional as F


def load(path, shape):
    with open(path, "rb") as f:
        data = bytearray(f.read())
    return torch.frombuffer(data, dtype=torch.bfloat16).reshape(shape).cuda()


def fp32_reference(q, k, v, cached):
    """[new, heads, d] in fp32, one kv head and at most ~2^29 scores at a time."""
    new, heads, d = q.shape
    total, kv_heads, _ = k.shape
    group = heads // kv_heads
    out = torch.empty(new, heads, d, dtype=torch.float32, device=q.device)
    positions = torch.arange(total, device=q.device)
    rows = max(1, (1 << 29) // (group * total))
    for h in range(kv_heads):
        keys, values = k[:, h, :].float(), v[:, h, :].float()
        for start in range(0, new, rows):
            stop = min(new, start + rows)
            qh = q[start:stop, h * group:(h + 1) * group, :].float().transpose(0, 1)  # [group, rows, d]
            scores = torch.matmul(qh, keys.T) * d ** -0.5
            limit = cached + torch.arange(start, stop, device=q.device) + 1
            scores.masked_fill_((positions[None, :] >= limit[:, None])[None], float("-inf"))
            out[start:stop, h * group:(h + 1) * group, :] = torch.matmul(torch.softmax(scores, -1), values).transpose(0, 1)
    return out


def bf16_sdpa(q, k, v, cached):
    new, heads, _ = q.shape
    group = heads // k.shape[1]
    qt = q.transpose(0, 1)[None]  # [1, heads, new, d]
    kt = k.repeat_interleave(group, dim=1).transpose(0, 1)[None]
    vt = v.repeat_interleave(group, dim=1).transpose(0, 1)[None]
    if cached == 0:
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)[0].transpose(0, 1)
    positions = torch.arange(k.shape[0], device=q.device)
    keep = positions[None, :] < (cached + torch.arange(new, device=q.device) + 1)[:, None]
    return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=keep)[0].transpose(0, 1)


def errors(out, reference):
    error = out.float() - reference
    return float((error * error).sum() / (reference * reference).sum().clamp_min(1e-30)), float(error.abs().max())


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    failed = 0
    with open(sys.argv[1]) as cases:
        for line in cases:
            prefix, cached, new, heads, kv_heads, d = line.split()
            cached, new, heads, kv_heads, d = int(cached), int(new), int(heads), int(kv_heads), int(d)
            total = cached + new
            q = load(prefix + "q.bin", (new, heads, d))
            k = load(prefix + "k.bin", (total, kv_heads, d))
            v = load(prefix + "v.bin", (total, kv_heads, d))
            loom = load(prefix + "out.bin", (new, heads, d))
            reference = fp32_reference(q, k, v, cached)
            loom_nmse, loom_max = errors(loom, reference)
            sdpa_nmse, sdpa_max = errors(bf16_sdpa(q, k, v, cached), reference)
            ok = loom_nmse <= 4 * sdpa_nmse + 1e-8 and loom_max <= 4 * sdpa_max + 1e-3
            failed += not ok
            print(json.dumps({"cached": cached, "new": new, "heads": heads, "kv_heads": kv_heads, "head_dim": d,
                              "loom_nmse": loom_nmse, "loom_max_error": loom_max, "sdpa_bf16_nmse": sdpa_nmse,
                              "sdpa_bf16_max_error": sdpa_max, "pass": ok}), flush=True)
            del q, k, v, loom, reference
            torch.cuda.empty_cache()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
