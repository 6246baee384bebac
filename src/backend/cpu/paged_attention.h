// Paged KV writes and causal GQA attention over the KV pools (layout in
// backend/backend.h: slot = block_table[j / block_size] * block_size + j % block_size,
// each slot num_kv_heads x head_dim floats).
//
// Preconditions (checked by validate_batch before any of this runs): every
// sequence's block table covers its num_cached_tokens + num_new_tokens entries
// and every block id is inside the pools.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace loom::cpu {

struct AttentionShape {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;

  int64_t slot_floats() const { return static_cast<int64_t>(num_kv_heads) * head_dim; }
};

// For each batch token: the index of its sequence, and its KV slot.
struct TokenPlacement {
  std::vector<int32_t> sequence_of_token;  // [num_tokens]
  std::vector<int64_t> slot_of_token;      // [num_tokens]
  int32_t max_context_length = 0;          // max over sequences of cached + new
  int64_t num_attended_entries = 0;        // sum over tokens of the KV entries each attends to
};

// Fills `placement` (reusing its capacity) for a validated batch.
void place_tokens(const Batch& batch, int block_size, TokenPlacement& placement);

// Copies k/v rows [num_tokens, num_kv_heads * head_dim] into their slots.
void write_kv(const float* k, const float* v, const TokenPlacement& placement, int64_t slot_floats,
              float* k_pool, float* v_pool);

// out[t, h * head_dim ...] = softmax(q_t,h . K^T / sqrt(head_dim)) V over the KV
// entries 0 .. num_cached_tokens + i of token t's sequence (t is its new token i).
// Query head h reads kv head h / (num_heads / num_kv_heads).
// Decode-like sequences (few new tokens) go token by token and head by head;
// prefill chunks go as sgemms over chunks of queries per kv head (gathering that
// head's K and V into dense scratch first). `scratch` grows to
// num_threads * max_context_length * (2 * head_dim + 64) floats at most and is
// kept by the caller between calls. Runs an OpenMP parallel region with
// `num_threads` threads when there is enough work to pay for it. OpenBLAS must
// be single-threaded (see gemm.h).
void paged_attention(const float* q, const Batch& batch, const TokenPlacement& placement,
                     const AttentionShape& shape, const float* k_pool, const float* v_pool,
                     int num_threads, std::vector<float>& scratch, float* out);

}  // namespace loom::cpu
