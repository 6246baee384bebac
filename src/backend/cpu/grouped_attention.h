// Causal attention of a group of query rows that read the same kv head of one
// sequence, straight from the paged K/V pools (layout in paged_attention.h):
// the prefill-chunk path of paged_attention (a chunk of queries, every query
// head of one kv head, and the decoder rows paired with them).
//
// The rows are stacked (up to kMaxGroupedRows per pass, query heads side by
// side) so that one walk over the kv head's entries serves all of them, and K
// and V are read where they lie, block by block: nothing is gathered into
// dense copies, which for a short tail over a long cached prefix (14 queries
// over 2K entries) cost as much as the arithmetic.
//
// Per pass (rows r, entries j; every row vector holds 8 rows side by side):
//
//   queries^T  [head_dim][rows]       transposed once per pass
//   scores^T   [entries][rows]        S[j][r] = q_r . k_j / sqrt(head_dim), then
//                                     exp(S - max_r), 0 where j >= num_visible(r)
//   out[r]     = (sum_j S[j][r] v_j) / sum_j S[j][r]
//
// Two passes over the entries (scores whole, then P V), so the result matches
// the plain softmax-then-PV reference up to float summation order.
//
// Thread: pure over its arguments; runs on the calling thread (paged_attention
// calls it from its parallel loop, one scratch per thread).
#pragma once

#include <cstdint>
#include <span>

#include "backend/cpu/paged_attention.h"

namespace loom::cpu {

// One query row: a query head's vector, where its output goes (head_dim floats
// each), and how many KV entries it attends to (entries 0 .. num_visible - 1).
struct QueryRow {
  const float* query = nullptr;
  float* out = nullptr;
  int32_t num_visible = 0;
};

// Rows one pass works on at most (a multiple of 8).
inline constexpr int32_t kMaxGroupedRows = 64;

// Floats of scratch attend_grouped_rows needs when no row sees more than
// `max_context_length` entries.
int64_t grouped_attention_scratch_floats(const AttentionShape& shape, int32_t max_context_length);

// out = softmax(query . K^T / sqrt(head_dim)) V for every row, over the entries
// of kv head `kv_head` that `block_table` maps (entry j in slot
// block_table[j / block_size] * block_size + j % block_size). Rows are taken
// kMaxGroupedRows at a time; any order works, but rows with similar
// num_visible side by side waste the least work (a row vector is computed up
// to the largest num_visible among its 8 rows). Preconditions: every
// num_visible >= 1 and within the block table; `scratch` holds
// grouped_attention_scratch_floats(shape, max num_visible) floats.
void attend_grouped_rows(std::span<const QueryRow> rows, const int32_t* block_table, const AttentionShape& shape,
                         int kv_head, const float* k_pool, const float* v_pool, float* scratch);

}  // namespace loom::cpu
