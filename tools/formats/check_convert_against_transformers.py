#!/usr/bin/env python3
"""Checks `loom convert GGUF DIR` output with transformers (run with the reference venv):
the converted directory must load with AutoModelForCausalLM / AutoTokenizer, hold the
same weights as transformers' own GGUF loader, and give the same logits.

  /opt/gold/bin/python tools/formats/check_convert_against_transformers.py MODEL.gguf CONVERTED_DIR
"""
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPT = "The capital of France is"


def main():
    gguf_path, converted = sys.argv[1], sys.argv[2]
    gguf_dir, gguf_file = os.path.dirname(gguf_path), os.path.basename(gguf_path)
    from_gguf = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32).eval()
    from_dir = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32).eval()

    reference_state, converted_state = from_gguf.state_dict(), from_dir.state_dict()
    assert reference_state.keys() == converted_state.keys(), "different parameter names"
    weight_diff = max((reference_state[k] - converted_state[k]).abs().max().item() for k in reference_state)
    print(f"max |weight difference|: {weight_diff}")

    tokenizer = AutoTokenizer.from_pretrained(converted)
    reference_tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    reference_ids = reference_tokenizer(PROMPT, return_tensors="pt").input_ids
    print(f"prompt ids (converted tokenizer): {ids.tolist()}  (gguf tokenizer): {reference_ids.tolist()}")
    with torch.no_grad():
        logits = from_dir(ids).logits
        reference_logits = from_gguf(ids).logits
    logit_diff = (logits - reference_logits).abs().max().item()
    print(f"max |logit difference| over {ids.shape[1]} positions: {logit_diff}")
    print("next token:", tokenizer.decode(logits[0, -1].argmax().item()))
    ok = weight_diff == 0.0 and logit_diff == 0.0 and ids.tolist() == reference_ids.tolist()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
