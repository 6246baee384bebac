#include "backend/cpu/residual_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/vector_math.h"

namespace loom::cpu {

namespace {

// KV entries rebuilt and scored together: enough to amortise the per-tile
// softmax bookkeeping, small enough for the tile to stay in L1.
constexpr int32_t kTileEntries = 32;

float dot(const float* a, const float* b, int64_t count) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < count; ++i) sum += a[i] * b[i];
  return sum;
}

const LoraModuleWeights* module_of(const LoraAdapter& adapter, int layer, LoraTarget target) {
  const auto& module = adapter.layers[layer][static_cast<int>(target)];
  return module.has_value() ? &*module : nullptr;
}

struct Scratch {
  float* keys;         // [kTileEntries, head_dim] rebuilt K of the tile
  float* scores;       // [kTileEntries]
  float* lora_key;     // [head_dim]
  float* accumulated_values;    // [queries, head_dim]  Σ p bV
  float* accumulated_residual;  // [queries, max_rank]  Σ p rV
  float* running_max;  // [queries]
  float* running_sum;  // [queries]
};

Scratch carve(float* scratch, const AttentionShape& shape, int64_t num_query_vectors, int max_rank) {
  Scratch s;
  s.keys = scratch;
  s.scores = s.keys + static_cast<int64_t>(kTileEntries) * shape.head_dim;
  s.lora_key = s.scores + kTileEntries;
  s.accumulated_values = s.lora_key + shape.head_dim;
  s.accumulated_residual = s.accumulated_values + num_query_vectors * shape.head_dim;
  s.running_max = s.accumulated_residual + num_query_vectors * max_rank;
  s.running_sum = s.running_max + num_query_vectors;
  return s;
}

}  // namespace

int64_t residual_attention_scratch_floats(const AttentionShape& shape, int32_t max_queries, int max_rank) {
  const int64_t num_query_vectors =
      static_cast<int64_t>(max_queries) * (shape.num_heads / shape.num_kv_heads);
  return static_cast<int64_t>(kTileEntries) * (shape.head_dim + 1) + shape.head_dim +
         num_query_vectors * (shape.head_dim + max_rank + 2);
}

void residual_attend(const float* q, const Batch& batch, const BatchSequence& sequence, int32_t first_query,
                     int32_t num_queries, const AttentionShape& shape, int kv_head, const float* k_pool,
                     const float* v_pool, const ForkedAttention& forked, float* scratch, float* out) {
  const int head_dim = shape.head_dim;
  const int64_t half = head_dim / 2;
  const int64_t q_size = static_cast<int64_t>(shape.num_heads) * head_dim;
  const int64_t slot_floats = shape.slot_floats();
  const int64_t head_offset = static_cast<int64_t>(kv_head) * head_dim;
  const int heads_per_kv_head = shape.num_heads / shape.num_kv_heads;
  const int64_t num_query_vectors = static_cast<int64_t>(num_queries) * heads_per_kv_head;
  const int max_rank = forked.max_rank;
  const int64_t residual_floats = 2 * static_cast<int64_t>(max_rank);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));

  const LoraAdapter& adapter = *(*forked.adapters)[sequence.forked_adapter_slot];
  const LoraModuleWeights* k_module = module_of(adapter, forked.layer, LoraTarget::kK);
  const LoraModuleWeights* v_module = module_of(adapter, forked.layer, LoraTarget::kV);
  // This kv head's rows of B ([kv_size, rank] row-major).
  const float* k_up = k_module != nullptr ? k_module->b.data + head_offset * k_module->rank : nullptr;
  const float* v_up = v_module != nullptr ? v_module->b.data + head_offset * v_module->rank : nullptr;

  Scratch s = carve(scratch, shape, num_query_vectors, max_rank);
  std::fill(s.accumulated_values, s.accumulated_values + num_query_vectors * head_dim, 0.0f);
  if (v_module != nullptr)
    std::fill(s.accumulated_residual, s.accumulated_residual + num_query_vectors * max_rank, 0.0f);
  std::fill(s.running_max, s.running_max + num_query_vectors, -std::numeric_limits<float>::infinity());
  std::fill(s.running_sum, s.running_sum + num_query_vectors, 0.0f);

  const int32_t* block_table = batch.block_tables.data() + sequence.block_table_offset;
  const int32_t* residual_table = batch.residual_block_tables.data() + sequence.residual_block_table_offset;
  const int block_size = shape.block_size;
  const int residual_block_size = forked.residual_block_size;
  const int32_t context_length = sequence.num_cached_tokens + first_query + num_queries;
  const int64_t first_row = static_cast<int64_t>(sequence.token_offset) + first_query;

  int64_t slots[kTileEntries];
  int64_t residual_slots[kTileEntries];
  for (int32_t tile_start = 0; tile_start < context_length; tile_start += kTileEntries) {
    const int32_t tile_count = std::min(kTileEntries, context_length - tile_start);
    for (int32_t e = 0; e < tile_count; ++e) {
      const int32_t j = tile_start + e;
      slots[e] = static_cast<int64_t>(block_table[j / block_size]) * block_size + j % block_size;
      residual_slots[e] =
          static_cast<int64_t>(residual_table[j / residual_block_size]) * residual_block_size +
          j % residual_block_size;
    }
    // Stage 1: K = bK + RoPE_j(s_k · rK · B_k^T), entry by entry.
    for (int32_t e = 0; e < tile_count; ++e) {
      const float* base_key = k_pool + slots[e] * slot_floats + head_offset;
      float* key = s.keys + static_cast<int64_t>(e) * head_dim;
      if (k_module == nullptr) {
        std::memcpy(key, base_key, static_cast<size_t>(head_dim) * sizeof(float));
        continue;
      }
      const float* residual_key = forked.residual_pool + residual_slots[e] * residual_floats;
      const int64_t rank = k_module->rank;
      for (int d = 0; d < head_dim; ++d) s.lora_key[d] = k_module->scale * dot(k_up + d * rank, residual_key, rank);
      const int64_t position = tile_start + e;
      forked.rope->rotate(s.lora_key, 1, forked.rope_cos + position * half, forked.rope_sin + position * half);
#pragma omp simd
      for (int d = 0; d < head_dim; ++d) key[d] = base_key[d] + s.lora_key[d];
    }

    // Stage 2: scores and the online softmax, accumulating P·bV and P·rV.
    for (int32_t i = 0; i < num_queries; ++i) {
      const int32_t visible = sequence.num_cached_tokens + first_query + i + 1;
      const int32_t count = std::min(tile_count, visible - tile_start);
      if (count <= 0) continue;
      for (int h = 0; h < heads_per_kv_head; ++h) {
        const int64_t vector = static_cast<int64_t>(i) * heads_per_kv_head + h;
        const int head = kv_head * heads_per_kv_head + h;
        const float* query = q + (first_row + i) * q_size + static_cast<int64_t>(head) * head_dim;
        float tile_max = -std::numeric_limits<float>::infinity();
        for (int32_t e = 0; e < count; ++e) {
          s.scores[e] = dot(query, s.keys + static_cast<int64_t>(e) * head_dim, head_dim) * scale;
          tile_max = std::max(tile_max, s.scores[e]);
        }
        const float new_max = std::max(s.running_max[vector], tile_max);
        const float correction = std::exp(s.running_max[vector] - new_max);
        s.running_sum[vector] = s.running_sum[vector] * correction + exp_shifted_in_place(s.scores, count, new_max);
        s.running_max[vector] = new_max;

        float* accumulated = s.accumulated_values + vector * head_dim;
#pragma omp simd
        for (int d = 0; d < head_dim; ++d) accumulated[d] *= correction;
        for (int32_t e = 0; e < count; ++e) {
          const float weight = s.scores[e];
          const float* value = v_pool + slots[e] * slot_floats + head_offset;
#pragma omp simd
          for (int d = 0; d < head_dim; ++d) accumulated[d] += weight * value[d];
        }
        if (v_module == nullptr) continue;
        const int64_t rank = v_module->rank;
        float* residual = s.accumulated_residual + vector * max_rank;
        for (int64_t r = 0; r < rank; ++r) residual[r] *= correction;
        for (int32_t e = 0; e < count; ++e) {
          const float weight = s.scores[e];
          const float* residual_value = forked.residual_pool + residual_slots[e] * residual_floats + max_rank;
#pragma omp simd
          for (int64_t r = 0; r < rank; ++r) residual[r] += weight * residual_value[r];
        }
      }
    }
  }

  // Stage 3: out = (Σ p bV + (Σ p rV) · s_v B_v^T) / Σ p.
  for (int32_t i = 0; i < num_queries; ++i) {
    for (int h = 0; h < heads_per_kv_head; ++h) {
      const int64_t vector = static_cast<int64_t>(i) * heads_per_kv_head + h;
      const int head = kv_head * heads_per_kv_head + h;
      float* output = out + (first_row + i) * q_size + static_cast<int64_t>(head) * head_dim;
      const float* accumulated = s.accumulated_values + vector * head_dim;
      const float inverse_sum = 1.0f / s.running_sum[vector];
      if (v_module == nullptr) {
        for (int d = 0; d < head_dim; ++d) output[d] = accumulated[d] * inverse_sum;
        continue;
      }
      const int64_t rank = v_module->rank;
      const float* residual = s.accumulated_residual + vector * max_rank;
      for (int d = 0; d < head_dim; ++d)
        output[d] = (accumulated[d] + v_module->scale * dot(v_up + d * rank, residual, rank)) * inverse_sum;
    }
  }
}

void write_residuals(const float* normed, int64_t hidden, const Batch& batch, const TokenPlacement& placement,
                     int layer, const std::vector<std::shared_ptr<const LoraAdapter>>& adapters, int max_rank,
                     float* residual_pool, std::vector<float>& scratch) {
  const int64_t residual_floats = 2 * static_cast<int64_t>(max_rank);
  for (const BatchSequence& sequence : batch.sequences) {
    if (sequence.forked_adapter_slot < 0) continue;
    // Present entries are a prefix: compute from the first one to write.
    const int32_t first = std::max(0, sequence.num_residual_present_tokens - sequence.num_cached_tokens);
    const int64_t num_rows = sequence.num_new_tokens - first;
    if (num_rows <= 0) continue;
    const int64_t first_token = static_cast<int64_t>(sequence.token_offset) + first;
    const LoraAdapter& adapter = *adapters[sequence.forked_adapter_slot];
    const LoraTarget targets[2] = {LoraTarget::kK, LoraTarget::kV};
    for (int half = 0; half < 2; ++half) {
      const LoraModuleWeights* module = module_of(adapter, layer, targets[half]);
      if (module == nullptr) continue;
      const int64_t rank = module->rank;
      scratch.resize(static_cast<size_t>(num_rows * rank));
      linear(normed + first_token * hidden, num_rows, hidden, module->a.data, nullptr, rank, scratch.data());
      for (int64_t r = 0; r < num_rows; ++r) {
        const int64_t slot = placement.residual_slot_of_token[first_token + r];
        if (slot < 0) continue;
        std::memcpy(residual_pool + slot * residual_floats + half * max_rank, scratch.data() + r * rank,
                    static_cast<size_t>(rank) * sizeof(float));
      }
    }
  }
}

}  // namespace loom::cpu
