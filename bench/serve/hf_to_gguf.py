#!/usr/bin/env python3
"""Writes a Hugging Face Llama directory (such as `loom make-model --preset 8b`'s) as an F16 GGUF file.

For serving the same weights with Loom and with llama.cpp's llama-server (bench/serve/serve_bench.py).
llama.cpp's own converter refuses tokenizers whose pre-tokenizer it has not seen (Loom's random
models' tokenizers), so this writes the GGUF itself, in llama.cpp's layout:
  - matrices as F16, norms as F32; q_proj and k_proj rows permuted from HF's half-split RoPE order
    to GGUF's interleaved order (Loom's GGUF reader un-permutes them: src/formats/gguf_names.h);
  - Llama 3 rope scaling as the tensor rope_freqs.weight (one wavelength factor per rotary pair);
  - the byte-level BPE tokenizer as tokenizer.ggml.model "gpt2", pre-tokenizer "llama-bpe",
    added special tokens typed as control tokens, the chat template, bos/eos and add_bos.

Reads safetensors (one file or an index of shards) with numpy (bench/gguf_llama.py); needs the `gguf` package
(llama.cpp's gguf-py: PYTHONPATH=<llama.cpp>/gguf-py) and numpy. Llama only.

    bench/serve/hf_to_gguf.py MODEL_DIR OUT.gguf
"""
import argparse
import json
import math
import os
import sys

import gguf
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gguf_llama import LAYER_MODULES, load_f32, model_safetensors, permute_rope_rows  # noqa: E402


def llama3_rope_factors(config, head_dim):
    """The wavelength factor of each rotary pair under Llama 3 rope scaling, or None."""
    scaling = config.get("rope_scaling") or config.get("rope_parameters")
    if not scaling or scaling.get("rope_type", scaling.get("type")) != "llama3":
        return None
    theta = scaling.get("rope_theta", config.get("rope_theta", 10000.0))
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    original = scaling.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = original / low, original / high
    factors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi / (theta ** (-i / head_dim))
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def gguf_name(hf_name):
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    parts = hf_name.split(".")
    if parts[:2] == ["model", "layers"] and parts[-1] == "weight":
        module = ".".join(parts[3:-1])
        if module in LAYER_MODULES:
            return f"blk.{parts[2]}.{LAYER_MODULES[module]}.weight"
    raise SystemExit(f"tensor {hf_name}: no GGUF name (Llama only)")


def add_tokenizer(writer, model_dir, vocab_size):
    tok = json.load(open(os.path.join(model_dir, "tokenizer.json")))
    tok_config = json.load(open(os.path.join(model_dir, "tokenizer_config.json")))
    if tok["model"]["type"] != "BPE":
        raise SystemExit("tokenizer.json: only byte-level BPE is handled")
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [gguf.TokenType.UNUSED] * vocab_size
    for text, token_id in tok["model"]["vocab"].items():
        tokens[token_id], types[token_id] = text, gguf.TokenType.NORMAL
    ids = {}
    for added in tok.get("added_tokens", []):
        tokens[added["id"]] = added["content"]
        types[added["id"]] = gguf.TokenType.CONTROL if added.get("special") else gguf.TokenType.USER_DEFINED
        ids[added["content"]] = added["id"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"].get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for key, add in (("bos_token", writer.add_bos_token_id), ("eos_token", writer.add_eos_token_id),
                     ("pad_token", writer.add_pad_token_id)):
        value = tok_config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if value in ids:
            add(ids[value])
    writer.add_add_bos_token(bool(tok_config.get("add_bos_token", False)))
    if tok_config.get("chat_template"):
        writer.add_chat_template(tok_config["chat_template"])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("output")
    args = parser.parse_args()

    config = json.load(open(os.path.join(args.model_dir, "config.json")))
    if config.get("model_type") != "llama":
        raise SystemExit(f"model_type {config.get('model_type')}: Llama only")
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads", config["num_attention_heads"])
    hidden = config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // heads
    scaling = config.get("rope_parameters") or {}
    rope_theta = config.get("rope_theta", scaling.get("rope_theta", 10000.0))

    writer = gguf.GGUFWriter(args.output, "llama")
    writer.add_name(os.path.basename(os.path.normpath(args.model_dir)))
    writer.add_context_length(config.get("max_position_embeddings", 4096))
    writer.add_embedding_length(hidden)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope_theta))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-5)))
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    add_tokenizer(writer, args.model_dir, config["vocab_size"])

    factors = llama3_rope_factors(dict(config, rope_theta=rope_theta), head_dim)
    if factors is not None:
        writer.add_tensor("rope_freqs.weight", factors)
    for hf_name, entry in sorted(model_safetensors(args.model_dir).items()):
        values = load_f32(entry)
        if hf_name.endswith("self_attn.q_proj.weight"):
            values = permute_rope_rows(values, heads)
        elif hf_name.endswith("self_attn.k_proj.weight"):
            values = permute_rope_rows(values, kv_heads)
        # llama.cpp keeps 1-D tensors (norms) in F32.
        writer.add_tensor(gguf_name(hf_name), values if values.ndim == 1 else values.astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()


if __name__ == "__main__":
    main()
