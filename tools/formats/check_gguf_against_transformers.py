#!/usr/bin/env python3
"""Compares the weights Loom reads from a GGUF file with transformers' own GGUF loader.

Run with the reference venv (torch + transformers 5 + gguf):
  /opt/gold/bin/python tools/formats/check_gguf_against_transformers.py MODEL.gguf LOOM.safetensors
where LOOM.safetensors comes from tools/formats/gguf_weights_to_safetensors.cc.
Prints the max |difference| per tensor class and exits 1 unless every tensor matches exactly.
"""
import os
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def main():
    gguf_path, loom_path = sys.argv[1], sys.argv[2]
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path), dtype=torch.float32)
    reference = {k: v for k, v in model.state_dict().items()}
    loom = load_file(loom_path)
    tied = model.config.tie_word_embeddings
    print("transformers config:", model.config.to_dict() if "-v" in sys.argv else "")
    worst = 0.0
    mismatched = []
    for name, expected in reference.items():
        if name == "lm_head.weight" and tied and name not in loom:
            name_in_loom = "model.embed_tokens.weight"
        else:
            name_in_loom = name
        if name_in_loom not in loom:
            mismatched.append(f"{name}: missing in Loom")
            continue
        got = loom[name_in_loom]
        if got.shape != expected.shape:
            mismatched.append(f"{name}: shape {tuple(got.shape)} vs {tuple(expected.shape)}")
            continue
        diff = (got.float() - expected.float()).abs().max().item()
        worst = max(worst, diff)
        if diff != 0.0:
            mismatched.append(f"{name}: max diff {diff}")
    extra = sorted(set(loom) - set(reference))
    print(f"{len(reference)} reference tensors, {len(loom)} Loom tensors, extra in Loom: {extra}")
    print(f"max |loom - transformers| over all tensors: {worst}")
    for line in mismatched[:20]:
        print("MISMATCH", line)
    sys.exit(1 if mismatched else 0)


if __name__ == "__main__":
    main()
