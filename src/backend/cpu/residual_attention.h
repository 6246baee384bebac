// ForkKV's disaggregated KV on the CPU (arXiv:2604.06370 §5; docs/design.md §1 "forked"):
// the rCache writes of forked sequences and ResidualAttention.
//
// A forked sequence with adapter (A_k, B_k, s_k), (A_v, B_v, s_v) keeps, per KV
// entry j and layer:
//   main pool (bCache)  bK_j = RoPE_j(x·W_k^T + b_k),  bV_j = x·W_v^T + b_v
//   rCache slot         [rK_j = x·A_k^T (r_k values) ... | rV_j = x·A_v^T (r_v values) ...]
//                        <------- max_rank -------->      <------- max_rank -------->
// (unscaled; a layer without k or v LoRA leaves its half unwritten and unread).
// Attention then uses, without materialising per-agent K/V:
//   K_j = bK_j + RoPE_j(s_k · rK_j · B_k^T)           rebuilt per tile (deferred RoPE)
//   out = (Σ_j p_j bV_j + (Σ_j p_j rV_j) · s_v B_v^T) / Σ_j p_j    (online softmax;
//         V's up-projection once, after the loop)
// Entry j's RoPE position is j (validate_batch checks forked positions).
//
// Thread: the functions are pure over their arguments; residual_attend runs on
// the calling thread (paged_attention calls it from its parallel loop).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/paged_attention.h"
#include "backend/rope.h"
#include "lora/adapter.h"

namespace loom::cpu {

// What paged_attention needs for forked sequences in one layer.
struct ForkedAttention {
  const float* residual_pool = nullptr;  // this layer's rCache, slots of 2 * max_rank floats
  int residual_block_size = 0;
  int max_rank = 0;
  int layer = 0;
  const std::vector<std::shared_ptr<const LoraAdapter>>* adapters = nullptr;  // by slot
  const Rope* rope = nullptr;
  // cos/sin tables of positions 0 .. max_forked_context_length - 1, head_dim / 2 floats each.
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
};

// Floats of scratch one residual_attend call needs for up to `max_queries` queries.
int64_t residual_attention_scratch_floats(const AttentionShape& shape, int32_t max_queries, int max_rank);

// Queries [first_query, first_query + num_queries) of the forked `sequence`, all
// query heads of `kv_head`: query i sees entries 0 .. num_computed_tokens + i.
// q and out are the attention rows ([rows, num_heads * head_dim]).
void residual_attend(const float* q, const Batch& batch, const BatchSequence& sequence, int32_t first_query,
                     int32_t num_queries, const AttentionShape& shape, int kv_head, const float* k_pool,
                     const float* v_pool, const ForkedAttention& forked, float* scratch, float* out);

// Writes rK = x·A_k^T and rV = x·A_v^T of the forked sequences' tokens into
// their rCache slots (skipping slots of -1: present entries). `normed` is the
// layer's k/v projection input [num_tokens, hidden]. `scratch` grows as needed.
void write_residuals(const float* normed, int64_t hidden, const Batch& batch, const TokenPlacement& placement,
                     int layer, const std::vector<std::shared_ptr<const LoraAdapter>>& adapters, int max_rank,
                     float* residual_pool, std::vector<float>& scratch);

}  // namespace loom::cpu
