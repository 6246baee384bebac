#!/usr/bin/env python3
"""Writes a PEFT LoRA adapter as llama.cpp's GGUF LoRA adapter, for the side-by-side rows of the quality
table (issue 39: llama.cpp serving the same Q4_1 GGUF with the same trained adapter):

    bench/quality/peft_to_gguf_lora.py --base SmolLM2.gguf --adapter DIR --out adapter.gguf

llama.cpp's layout (its convert_lora_to_gguf.py writes the same): general.type "adapter", adapter.type
"lora", adapter.lora.alpha; per module `blk.N.<name>.weight.lora_a` (A, [r, in]) and `.lora_b` (B, [out, r]),
F32. The base GGUF's llama-family q and k rows are stored permuted (rotary halves interleaved, as
llama.cpp's converter writes them), so B of q_proj and k_proj is permuted the same way. Only what the
quality adapters use is handled: the 7 projections, plain LoRA (no rsLoRA, DoRA, biases or per-module
ranks); anything else is refused by name. Needs numpy and the `gguf` package (pip install gguf).
"""
import argparse
import json
import os
import sys

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover
    sys.exit("peft_to_gguf_lora.py needs the gguf package: pip install gguf")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gguf_llama import LAYER_MODULES, load_f32, permute_rope_rows, safetensors_index  # noqa: E402

# The projections a LoRA may target (the norms are not).
MODULES = {m: name for m, name in LAYER_MODULES.items() if m.startswith(("self_attn.", "mlp."))}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the base model's GGUF (architecture and head counts)")
    parser.add_argument("--adapter", required=True, help="a PEFT adapter directory")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    config = json.load(open(os.path.join(args.adapter, "adapter_config.json")))
    for key in ("use_rslora", "use_dora"):
        if config.get(key):
            sys.exit(f"{args.adapter}: {key} is not handled")
    if config.get("rank_pattern") or config.get("alpha_pattern") or config.get("bias", "none") != "none":
        sys.exit(f"{args.adapter}: per-module ranks, alphas or biases are not handled")

    reader = gguf.GGUFReader(args.base)
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")

    def field(key):
        return int(reader.fields[f"{arch}.{key}"].parts[-1][0])

    heads, kv_heads = field("attention.head_count"), field("attention.head_count_kv")
    permuted = arch == "llama"  # llama.cpp stores llama-family q/k permuted; qwen2 and others as in HF

    writer = gguf.GGUFWriter(args.out, arch)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(config["lora_alpha"]))
    tensors = safetensors_index([os.path.join(args.adapter, "adapter_model.safetensors")])
    written = 0
    for name in sorted(tensors):
        if ".lora_A." not in name:
            if ".lora_B." not in name:
                sys.exit(f"{args.adapter}: unexpected tensor {name}")
            continue
        prefix = name.split(".lora_A.")[0]  # base_model.model.model.layers.N.self_attn.q_proj
        parts = prefix.split(".")
        layer = int(parts[parts.index("layers") + 1])
        module = ".".join(parts[parts.index("layers") + 2:])
        if module not in MODULES:
            sys.exit(f"{args.adapter}: LoRA on {module} is not handled")
        a = load_f32(tensors[name])
        b = load_f32(tensors[name.replace(".lora_A.", ".lora_B.")])
        if permuted and module == "self_attn.q_proj":
            b = permute_rope_rows(b, heads)
        elif permuted and module == "self_attn.k_proj":
            b = permute_rope_rows(b, kv_heads)
        base = f"blk.{layer}.{MODULES[module]}.weight"
        writer.add_tensor(base + ".lora_a", np.ascontiguousarray(a, dtype=np.float32))
        writer.add_tensor(base + ".lora_b", np.ascontiguousarray(b, dtype=np.float32))
        written += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"{args.out}: {written} LoRA modules, rank {config['r']}, alpha {config['lora_alpha']}, arch {arch}")


if __name__ == "__main__":
    main()
