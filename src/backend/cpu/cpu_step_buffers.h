// The CPU backend's per-forward scratch (CpuBackend::forward), grown on demand
// and kept across steps so that a step allocates nothing once warm. Rows: the
// batch's tokens, then the decoder rows of base-mode sequences
// (paged_attention.h). Owned by one CpuBackend; the engine thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/paged_attention.h"

namespace loom::cpu {

struct CpuStepBuffers {
  int64_t num_tokens = 0;
  int64_t num_rows = 0;
  TokenPlacement placement;
  std::vector<int32_t> row_adapter_slots, kv_adapter_slots;  // when the batch shares KV (LoRA groups)
  std::vector<float> hidden;          // [rows, hidden] residual stream
  std::vector<float> normed;          // [rows, hidden]
  std::vector<float> q, k, v;         // [rows, q_size], [rows, kv_size] x2
  std::vector<float> attention_out;   // [rows, q_size]
  std::vector<float> projected;       // [rows, hidden] o_proj / down_proj output
  std::vector<float> gate, up;        // [rows, intermediate]
  std::vector<float> rope_cos, rope_sin;  // [rows, head_dim / 2]
  std::vector<float> attention_scratch;
  std::vector<float> residual_scratch;
  std::vector<int32_t> logit_tokens;  // [logits rows] batch token of each
  std::vector<int32_t> logit_rows;    // [logits rows] row it is read from (decoder row in base sharing)
};

}  // namespace loom::cpu
