#!/usr/bin/env python3
"""torch scaled_dot_product_attention on the shapes of loom_cuda_bench's attention
figures (bf16, GQA 32/8 heads, head_dim 128), for the ratio in bench/README.md.

  decode:  64 sequences x 1 query x 2048 keys (contiguous K/V, enable_gqa)
  prefill: 1 sequence x 8192 queries, causal

Prints JSON (median of CUDA-event timings after warm-up)."""
import json
import sys

import torch
import torch.nn.functional as F


def median_ms(fn, iterations=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iterations):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def main():
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    heads, kv_heads, d = 32, 8, 128
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}

    q = torch.randn(64, heads, 1, d, device=dev, dtype=dt)
    k = torch.randn(64, kv_heads, 2048, d, device=dev, dtype=dt)
    v = torch.randn(64, kv_heads, 2048, d, device=dev, dtype=dt)
    ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    out["decode"] = {"batch": 64, "context": 2048, "ms": ms}

    tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
    q = torch.randn(1, heads, tokens, d, device=dev, dtype=dt)
    k = torch.randn(1, kv_heads, tokens, d, device=dev, dtype=dt)
    v = torch.randn(1, kv_heads, tokens, d, device=dev, dtype=dt)
    ms_gqa = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), 10)
    # Expanded K/V (the flash backend may skip enable_gqa); the faster one counts.
    ke = k.repeat_interleave(heads // kv_heads, dim=1)
    ve = v.repeat_interleave(heads // kv_heads, dim=1)
    ms_expanded = median_ms(lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=True), 10)
    flops = 4.0 * heads * d * tokens * (tokens + 1) / 2
    best = min(ms_gqa, ms_expanded)
    out["prefill"] = {"tokens": tokens, "ms": best, "ms_enable_gqa": ms_gqa, "ms_expanded_kv": ms_expanded,
                      "tflops": flops / (best * 1e-3) / 1e12}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
