#!/usr/bin/env python3
"""Writes tests/fixtures/formats/smollm2_rows.safetensors: a few rows of SmolLM2-135M-Instruct
weights as transformers' own GGUF loader produces them (dequantized, Q/K un-permuted).
gguf_test compares Loom's reader against these rows when the model file is present.

  /opt/gold/bin/python tools/formats/make_smollm2_rows.py /path/SmolLM2-135M-Instruct.Q4_1.gguf [OUT]

Each stored tensor is named "<hf name>" and holds the rows listed (as a JSON list)
in the metadata entry of the same name.
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

# Rows 0, 1, 32, 33 of q/k are the first rotate-half pair partners of head 0;
# 64+ rows are in head 1; the last rows end the tensor.
SELECTION = {
    "model.embed_tokens.weight": [0, 1, 2, 49151],          # Q8_0
    "model.layers.0.self_attn.q_proj.weight": [0, 1, 31, 32, 33, 63, 64, 575],   # Q4_1, permuted (9 heads)
    "model.layers.0.self_attn.k_proj.weight": [0, 1, 32, 33, 64, 191],           # Q4_1, permuted (3 kv heads)
    "model.layers.0.self_attn.v_proj.weight": [0, 191],
    "model.layers.29.mlp.down_proj.weight": [0, 575],
    "model.layers.29.input_layernorm.weight": None,         # F32, whole tensor
    "model.norm.weight": None,
}


def main():
    gguf_path = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        os.path.dirname(__file__), "..", "..", "tests", "fixtures", "formats", "smollm2_rows.safetensors")
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path),
                                                 dtype=torch.float32)
    state = model.state_dict()
    tensors, metadata = {}, {"format": "pt"}
    for name, rows in SELECTION.items():
        full = state[name].float()
        if rows is None:
            tensors[name] = full.contiguous()
            metadata[name] = "all"
        else:
            tensors[name] = full[rows].contiguous()
            metadata[name] = json.dumps(rows)
    save_file(tensors, out, metadata=metadata)


if __name__ == "__main__":
    main()
