// Paged KV writes and causal GQA attention over the KV pools (layout in
// backend/backend.h: slot = block_table[j / block_size] * block_size + j % block_size,
// each slot num_kv_heads x head_dim floats).
//
// Rows. The activations the backend works on have one row per batch token,
// followed by the decoder rows of base (ICaRus) sequences:
//
//   rows:  | token 0 ... token n-1 | decoder rows n ... n + num_decoder_rows - 1 |
//
// A decoder row pairs with one logits token of a base-mode sequence: same
// position, same context (the KV entries its token sees, its own entry being
// the token's), no K/V of its own. Attention serves both rows in one pass over
// the KV entries (their queries side by side along the head axis, ICaRus).
// Forked (ForkKV) sequences go through residual_attention.h instead.
//
// Preconditions (checked by validate_batch before any of this runs): every
// sequence's block table covers its num_computed_tokens + num_new_tokens entries
// and every block id is inside the pools.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace loom::cpu {

struct ForkedAttention;  // residual_attention.h

struct AttentionShape {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;

  int64_t slot_floats() const { return static_cast<int64_t>(num_kv_heads) * head_dim; }
};

// For each batch token: the index of its sequence, and its KV slots.
struct TokenPlacement {
  std::vector<int32_t> sequence_of_token;  // [num_tokens]
  // [num_tokens]: main-pool slot the token's K/V go to; -1 where the entry is
  // present (j < num_kv_present_tokens: shared, never written).
  std::vector<int64_t> slot_of_token;
  // [num_tokens] when has_forked_sequences (else empty): rCache slot, -1 for tokens
  // of other sequences and for present entries (j < num_residual_present_tokens).
  std::vector<int64_t> residual_slot_of_token;
  // Decoder rows (empty when the batch has none): the decoder row of each token
  // (-1: none), and the token each decoder row d (row num_tokens + d) pairs with.
  // A sequence's decoder rows are consecutive, in the order of their tokens.
  std::vector<int32_t> decoder_row_of_token;   // [num_tokens]
  std::vector<int32_t> token_of_decoder_row;   // [num_decoder_rows]
  int32_t max_context_length = 0;          // max over sequences of cached + new
  int32_t max_forked_context_length = 0;   // the same over forked sequences
  int64_t num_attended_entries = 0;        // sum over rows of the KV entries each attends to
  bool has_forked_sequences = false;

  int32_t num_decoder_rows() const { return static_cast<int32_t>(token_of_decoder_row.size()); }
};

// Fills `placement` (reusing its capacity) for a validated batch. Residual
// slots use `residual_block_size` (only read when the batch has forked sequences).
void place_tokens(const Batch& batch, int block_size, TokenPlacement& placement,
                  int residual_block_size = 0);

// Copies k/v rows [num_tokens, num_kv_heads * head_dim] into their slots,
// skipping tokens whose slot is -1 (present entries).
void write_kv(const float* k, const float* v, const TokenPlacement& placement, int64_t slot_floats,
              float* k_pool, float* v_pool);

// out[r, h * head_dim ...] = softmax(q_r,h . K^T / sqrt(head_dim)) V over the KV
// entries 0 .. num_computed_tokens + i of row r's sequence (r is its new token i,
// or the decoder row paired with it). q and out have one row per token and
// decoder row (num_heads * head_dim floats each). Query head h reads kv head
// h / (num_heads / num_kv_heads).
// Each sequence's new tokens (one in decode, a warm prefix's short tail, a
// prefill chunk) go in chunks of queries per kv head, every query head of it
// and the decoder rows paired with them at once, reading K and V in place
// (grouped_attention.h): one walk over a kv head's entries per chunk.
// Forked sequences need `forked` (else nullptr) and go through
// ResidualAttention. `scratch` is kept by the caller between calls. Runs an
// OpenMP parallel region with `num_threads` threads when there is enough work
// to pay for it. OpenBLAS must be single-threaded (see gemm.h).
void paged_attention(const float* q, const Batch& batch, const TokenPlacement& placement,
                     const AttentionShape& shape, const float* k_pool, const float* v_pool,
                     int num_threads, std::vector<float>& scratch, float* out,
                     const ForkedAttention* forked = nullptr);

}  // namespace loom::cpu
