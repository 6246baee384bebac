#!/usr/bin/env python3
"""Writes the small fixtures under tests/fixtures/formats/ with independent tools
(python `gguf` and `safetensors`, numpy), so Loom's readers are checked against
other implementations rather than against Loom's own writers.

  /opt/gold/bin/python tools/formats/make_format_fixtures.py [OUT_DIR]   (needs torch, gguf)

Outputs:
  python_written.safetensors    F32/F16/BF16 tensors with hand-picked values (see tests)
  tiny_llama.gguf               llama-arch GGUF: 2 layers, hidden 64, 4 heads / 2 kv heads,
                                head_dim 16, intermediate 96, vocab 32; tensors in
                                Q8_0/Q4_0/Q4_1/F16/BF16/F32 with Q/K rows permuted
                                exactly as llama.cpp's convert_hf_to_gguf.py does
  tiny_llama_expected.safetensors  the HF-layout weights a correct reader must return:
                                gguf-py's dequantize() followed by the inverse permutation
                                (transformers' LlamaTensorProcessor formula), float32
The GGUF also loads in transformers (check_fixture_with_transformers below, run with
the reference venv) which gives the same tensors as the expected file.
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from safetensors.numpy import save_file

HIDDEN, HEADS, KV_HEADS, LAYERS, INTERMEDIATE, VOCAB = 64, 4, 2, 2, 96, 32
HEAD_DIM = HIDDEN // HEADS


def permute(weights, n_head, n_head_kv):
    # llama.cpp convert_hf_to_gguf.py LlamaModel.permute
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def reverse_permute(weights, n_head):
    # transformers modeling_gguf_pytorch_utils.LlamaTensorProcessor._reverse_permute_weights
    dim = weights.shape[0] // n_head // 2
    w = weights.reshape(n_head, dim, 2, *weights.shape[1:])
    return w.swapaxes(2, 1).reshape(weights.shape)


def tokens():
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = specials + letters + ["\u0120", "\u0120a", "ab"]
    assert len(vocab) == VOCAB
    types = [3, 3, 3] + [1] * (VOCAB - 3)
    return vocab, types, ["\u0120 a", "a b"]


def write_safetensors_fixture(out_dir):
    import torch
    from safetensors.torch import save_file as save_torch
    tensors = {
        "f32": torch.tensor([[1.0, -2.5, 3.25], [0.0, 1e-3, -7.0]], dtype=torch.float32),
        "f16": torch.tensor([1.0, -0.5, 65504.0, 2.0 ** -24], dtype=torch.float16),
        "bf16": torch.tensor([[1.0, -3.0], [0.15625, 1.5 * 2.0 ** 127]], dtype=torch.bfloat16),
    }
    save_torch(tensors, os.path.join(out_dir, "python_written.safetensors"), metadata={"format": "pt"})


def write_gguf_fixture(out_dir):
    rng = np.random.default_rng(1234)

    def randn(*shape, scale=0.1):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    hf = {"model.embed_tokens.weight": randn(VOCAB, HIDDEN), "model.norm.weight": 1 + randn(HIDDEN),
          "lm_head.weight": randn(VOCAB, HIDDEN)}
    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        hf[p + "input_layernorm.weight"] = 1 + randn(HIDDEN)
        hf[p + "self_attn.q_proj.weight"] = randn(HEADS * HEAD_DIM, HIDDEN)
        hf[p + "self_attn.k_proj.weight"] = randn(KV_HEADS * HEAD_DIM, HIDDEN)
        hf[p + "self_attn.v_proj.weight"] = randn(KV_HEADS * HEAD_DIM, HIDDEN)
        hf[p + "self_attn.o_proj.weight"] = randn(HIDDEN, HEADS * HEAD_DIM)
        hf[p + "post_attention_layernorm.weight"] = 1 + randn(HIDDEN)
        hf[p + "mlp.gate_proj.weight"] = randn(INTERMEDIATE, HIDDEN)
        hf[p + "mlp.up_proj.weight"] = randn(INTERMEDIATE, HIDDEN)
        hf[p + "mlp.down_proj.weight"] = randn(HIDDEN, INTERMEDIATE)

    # (gguf name, hf name, type, permute heads) -- every supported type appears,
    # and Q/K use two different quantizations.
    plan = [("token_embd.weight", "model.embed_tokens.weight", Q.Q8_0, None),
            ("output_norm.weight", "model.norm.weight", Q.F32, None),
            ("output.weight", "lm_head.weight", Q.F16, None)]
    layer_types = [
        {"attn_q": Q.Q4_0, "attn_k": Q.Q4_1, "attn_v": Q.F16, "attn_output": Q.BF16,
         "ffn_gate": Q.Q8_0, "ffn_up": Q.Q4_1, "ffn_down": Q.Q4_0},
        {"attn_q": Q.Q8_0, "attn_k": Q.Q4_0, "attn_v": Q.Q4_1, "attn_output": Q.F32,
         "ffn_gate": Q.BF16, "ffn_up": Q.F16, "ffn_down": Q.Q8_0},
    ]
    hf_suffix = {"attn_q": "self_attn.q_proj.weight", "attn_k": "self_attn.k_proj.weight",
                 "attn_v": "self_attn.v_proj.weight", "attn_output": "self_attn.o_proj.weight",
                 "ffn_gate": "mlp.gate_proj.weight", "ffn_up": "mlp.up_proj.weight",
                 "ffn_down": "mlp.down_proj.weight"}
    for layer in range(LAYERS):
        plan.append((f"blk.{layer}.attn_norm.weight", f"model.layers.{layer}.input_layernorm.weight", Q.F32, None))
        plan.append((f"blk.{layer}.ffn_norm.weight", f"model.layers.{layer}.post_attention_layernorm.weight", Q.F32,
                     None))
        for short, qtype in layer_types[layer].items():
            heads = HEADS if short == "attn_q" else KV_HEADS if short == "attn_k" else None
            plan.append((f"blk.{layer}.{short}.weight", f"model.layers.{layer}.{hf_suffix[short]}", qtype, heads))

    writer = gguf.GGUFWriter(os.path.join(out_dir, "tiny_llama.gguf"), "llama")
    writer.add_name("tiny llama fixture")
    writer.add_block_count(LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(50000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    vocab, types, merges = tokens()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(vocab)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)

    expected = {}
    for gguf_name, hf_name, qtype, heads in plan:
        weights = hf[hf_name]
        if heads is not None:
            weights = permute(weights, HEADS, heads)
        if qtype == Q.F32:
            stored = weights
            writer.add_tensor(gguf_name, stored)
        elif qtype == Q.F16:
            stored = weights.astype(np.float16)
            writer.add_tensor(gguf_name, stored)
        else:
            stored = gguf.quants.quantize(weights, qtype)
            writer.add_tensor(gguf_name, stored, raw_dtype=qtype)
        values = gguf.quants.dequantize(stored, qtype).astype(np.float32).reshape(weights.shape)
        if heads is not None:
            values = reverse_permute(values, heads)
        expected[hf_name] = np.ascontiguousarray(values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    save_file(expected, os.path.join(out_dir, "tiny_llama_expected.safetensors"), metadata={"format": "pt"})


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "..", "tests", "fixtures", "formats")
    os.makedirs(out_dir, exist_ok=True)
    write_safetensors_fixture(out_dir)
    write_gguf_fixture(out_dir)


if __name__ == "__main__":
    main()
