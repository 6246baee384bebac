#!/usr/bin/env python3
"""Markdown tables from loom_cuda_bench's JSON and sdpa_reference.py's JSON.

  python3 bench/cuda/report.py bench/cuda/results/cuda_bench.json bench/cuda/results/sdpa.json
"""
import json
import sys


def main():
    bench = json.load(open(sys.argv[1]))
    sdpa = json.load(open(sys.argv[2])) if len(sys.argv) > 2 else None
    print(f"Device: {bench['device']}; measured device-to-device copy "
          f"{bench['measured_copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s (read + write).\n")
    peaks = bench.get("peaks", {"bandwidth_bytes_per_s": 3.35e12, "bf16_flops": 989e12, "source": "H100 (older JSON)"})
    print(f"Peaks: {peaks['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s, {peaks['bf16_flops'] / 1e12:.0f} TFLOP/s dense "
          f"bf16 ({peaks['source']}).\n")
    print(f"| decode, 2K context | step (CUDA graph) | eager | floor at {peaks['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s "
          "| step / floor | target |")
    print("|---:|---:|---:|---:|---:|---|")
    for row in bench.get("decode", []):
        note = " (KV blocks shared pairwise)" if row.get("kv_shared_pairwise") else ""
        target = "<= 1.4x" if row["batch"] <= 64 else "-"
        print(f"| batch {row['batch']}{note} | {row['graph_ms']:.2f} ms | {row['eager_ms']:.2f} ms | "
              f"{row['floor_ms']:.2f} ms | {row['graph_over_floor']:.2f}x | {target} |")
    for r in bench.get("decode", []):
        if r.get("cublas_gemm_graph_ms"):
            print(f"\nBatch {r['batch']} with cuBLAS for every GEMM instead of the skinny kernel: "
                  f"{r['cublas_gemm_graph_ms']:.2f} ms (default {r['graph_ms']:.2f} ms).")
    if "prefill" in bench:
        p = bench["prefill"]
        print(f"\nPrefill of {p['tokens']} tokens: {p['ms']:.1f} ms, {p['tflops']:.0f} TFLOP/s of matmul + attention "
              f"FLOPs, MFU {100 * p['mfu']:.1f}% of {peaks['bf16_flops'] / 1e12:.0f} TFLOP/s (target >= 40%).")
    if "lora" in bench:
        l = bench["lora"]
        print(f"\nMulti-LoRA: decode batch {l['batch']}, {l['adapters']} distinct adapters (r={l['rank']}, all seven "
              f"projections): {l['lora_graph_ms']:.2f} ms vs base only {l['base_graph_ms']:.2f} ms = "
              f"{l['ratio_graph']:.3f}x (target <= 1.15x; eager {l['ratio_eager']:.3f}x).")
    if "lora_placements" in bench:
        pl = bench["lora_placements"]
        print(f"LoRA kernel placements (graph): side stream beside the base GEMM {pl['side_stream_graph_ms']:.2f} ms "
              f"(default), the same with the expand as a programmatic dependent launch {pl['side_stream_pdl_graph_ms']:.2f} ms, "
              f"inline after the GEMM {pl['inline_graph_ms']:.2f} ms.")
        if "fused_side_stream_graph_ms" in pl:
            print(f"Fused shrink+expand kernel (one launch per group): side stream {pl['fused_side_stream_graph_ms']:.2f} ms, "
                  f"inline {pl['fused_inline_graph_ms']:.2f} ms; fused for q/k/v and o only: side stream "
                  f"{bench['lora_fused_attention']['side_stream_graph_ms']:.2f} ms.")
    if "lora_side_groups" in bench:
        names = ["q/k/v", "o", "gate/up", "down"]
        parts = []
        for row in bench["lora_side_groups"]:
            inline = [names[g] for g in range(4) if not (row["mask"] >> g) & 1]
            parts.append(f"{', '.join(inline) or 'none'} inline {row['graph_ms']:.2f}")
        print("LoRA groups inline instead of on the side stream (graph ms): " + "; ".join(parts) + ".")
    if "lora_skip" in bench:
        names = ["q/k/v shrink", "q/k/v expand", "o shrink", "o expand", "gate/up shrink", "gate/up expand",
                 "down shrink", "down expand"]
        parts = []
        for row in bench["lora_skip"]:
            skipped = [names[b] for b in range(8) if (row["mask"] >> b) & 1]
            parts.append(f"{'all' if len(skipped) == 8 else ', '.join(skipped)} {row['graph_ms']:.2f}")
        print("LoRA step with launches left out (wrong results, for attribution; graph ms): " + "; ".join(parts) + ".")
    if "sampling" in bench:
        sm = bench["sampling"]
        print(f"\nSampling on the device, {sm['rows']} rows x vocab {sm['vocab']}: kernel greedy "
              f"{sm['kernel_greedy_ms'] * 1e3:.0f} us, T 0.8 / top-k 50 / top-p 0.9 {sm['kernel_t0.8_topk50_topp0.9_ms'] * 1e3:.0f} us, "
              f"top-p 0.95 alone {sm['kernel_topp0.95_ms'] * 1e3:.0f} us. Decode-64 step wall time as the engine sees it "
              f"(eager forward + sampling, T 0.8 / top-k 50 / top-p 0.9): logits to the host and the host Sampler "
              f"{sm['step_wall_host_sampling_ms']:.1f} ms, sampled on the device {sm['step_wall_device_sampling_ms']:.2f} ms.")
    if "attention" in bench and sdpa:
        a = bench["attention"]
        print("\n| attention kernel (32/8 heads, d 128, bf16) | Loom (paged) | torch SDPA (contiguous) | Loom / SDPA time |")
        print("|---|---:|---:|---:|")
        if "attention_decode16" in bench:
            d16 = bench["attention_decode16"]
            print(f"| decode 16 x 2K | {d16['ms'] * 1e3:.0f} us ({d16['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s) | - | - |")
        d = a["decode"]
        print(f"| decode 64 x 2K | {d['ms'] * 1e3:.0f} us ({d['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s) | "
              f"{sdpa['decode']['ms'] * 1e3:.0f} us | {d['ms'] / sdpa['decode']['ms']:.2f} |")
        p = a["prefill"]
        print(f"| prefill {p['tokens']} causal | {p['ms']:.2f} ms ({p['tflops']:.0f} TFLOP/s) | "
              f"{sdpa['prefill']['ms']:.2f} ms ({sdpa['prefill']['tflops']:.0f} TFLOP/s) | "
              f"{p['ms'] / sdpa['prefill']['ms']:.2f} |")


if __name__ == "__main__":
    main()
