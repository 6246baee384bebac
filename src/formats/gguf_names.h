// GGUF tensor names -> Hugging Face names, and the Q/K row order fix-up.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace loom {

// "blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight" etc.
// Returns nullopt for a name outside the llama family's table (the caller keeps it as is).
std::optional<std::string> gguf_to_hf_tensor_name(const std::string& gguf_name);

// llama.cpp's convert_hf_to_gguf.py permutes the rows of HF's q_proj/k_proj
// (weights and biases) so that each head's rotate-half pairs (i, i + d/2) become
// adjacent pairs (2i, 2i + 1) for its interleaved RoPE:
//
//   GGUF row h*d + 2*i + j  <-  HF row h*d + j*(d/2) + i     (i < d/2, j in {0, 1}, d = head_dim)
//
// This reverses it in place: `rows` = num_heads * head_dim rows of `row_length` floats.
void unpermute_rope_rows(float* data, int64_t num_heads, int64_t head_dim, int64_t row_length);
// The same over rows of `row_bytes` bytes (quantized rows: a row permutation moves whole blocks).
void unpermute_rope_row_bytes(uint8_t* data, int64_t num_heads, int64_t head_dim, int64_t row_bytes);

}  // namespace loom
