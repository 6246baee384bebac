#include "backend/cpu/residual_attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/cpu_kernels.h"
#include "util/vector_math.h"

namespace loom::cpu {

namespace {

// KV entries rebuilt and scored together: enough for efficient sgemms and to
// amortise the online-softmax bookkeeping, small enough to stay in L1/L2.
constexpr int32_t kTileEntries = 64;
// Items with at least this many queries score and accumulate with sgemm; fewer
// (decode) with plain loops, where sgemm's call overhead would dominate.
constexpr int32_t kMinQueriesForGemm = 4;

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

// Per-call scratch. Query vectors (one per query and query head of the kv
// head's group) are numbered head-major: vector = h * num_queries + i.
struct Scratch {
  float* keys;                  // [kTileEntries, head_dim] rebuilt K of the tile
  float* values;                // [kTileEntries, head_dim] bV of the tile
  float* residual_values;       // [kTileEntries, v rank]   rV of the tile
  float* key_up_transposed;     // [k rank, head_dim]        (s_k B_k)^T of this kv head
  float* lora_key;              // [head_dim]
  float* scores;                // [vectors, kTileEntries]  scores, then probabilities
  float* accumulated_values;    // [vectors, head_dim]      Σ p bV
  float* accumulated_residual;  // [vectors, max_rank]      Σ p rV
  float* running_max;           // [vectors]
  float* running_sum;           // [vectors]
};

Scratch carve(float* scratch, const AttentionShape& shape, int64_t num_vectors, int max_rank) {
  const int64_t head_dim = shape.head_dim;
  Scratch s;
  s.keys = scratch;
  s.values = s.keys + kTileEntries * head_dim;
  s.residual_values = s.values + kTileEntries * head_dim;
  s.key_up_transposed = s.residual_values + kTileEntries * max_rank;
  s.lora_key = s.key_up_transposed + max_rank * head_dim;
  s.scores = s.lora_key + head_dim;
  s.accumulated_values = s.scores + num_vectors * kTileEntries;
  s.accumulated_residual = s.accumulated_values + num_vectors * head_dim;
  s.running_max = s.accumulated_residual + num_vectors * max_rank;
  s.running_sum = s.running_max + num_vectors;
  return s;
}

}  // namespace

int64_t residual_attention_scratch_floats(const AttentionShape& shape, int32_t max_queries, int max_rank) {
  const int64_t num_vectors = static_cast<int64_t>(max_queries) * (shape.num_heads / shape.num_kv_heads);
  const int64_t head_dim = shape.head_dim;
  return kTileEntries * (2 * head_dim + max_rank) + (max_rank + 1) * head_dim +
         num_vectors * (kTileEntries + head_dim + max_rank + 2);
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
  const int64_t num_vectors = static_cast<int64_t>(num_queries) * heads_per_kv_head;
  const int max_rank = forked.max_rank;
  const int64_t residual_floats = 2 * static_cast<int64_t>(max_rank);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const bool use_gemm = num_queries >= kMinQueriesForGemm;

  const LoraAdapter& adapter = *(*forked.adapters)[sequence.forked_adapter_slot];
  const LoraModuleWeights* k_module = module_of(adapter, forked.layer, LoraTarget::kK);
  const LoraModuleWeights* v_module = module_of(adapter, forked.layer, LoraTarget::kV);
  const int64_t k_rank = k_module != nullptr ? k_module->rank : 0;
  const int64_t v_rank = v_module != nullptr ? v_module->rank : 0;

  Scratch s = carve(scratch, shape, num_vectors, max_rank);
  // A key's LoRA part is then k_rank axpys over head_dim (B_k rows are only k_rank long).
  for (int64_t r = 0; r < k_rank; ++r)
    for (int d = 0; d < head_dim; ++d)
      s.key_up_transposed[r * head_dim + d] = k_module->scale * k_module->b.data[(head_offset + d) * k_rank + r];
  std::fill(s.accumulated_values, s.accumulated_values + num_vectors * head_dim, 0.0f);
  std::fill(s.accumulated_residual, s.accumulated_residual + num_vectors * max_rank, 0.0f);
  std::fill(s.running_max, s.running_max + num_vectors, -std::numeric_limits<float>::infinity());
  std::fill(s.running_sum, s.running_sum + num_vectors, 0.0f);

  const int32_t* block_table = batch.block_tables.data() + sequence.block_table_offset;
  const int32_t* residual_table = batch.residual_block_tables.data() + sequence.residual_block_table_offset;
  const int block_size = shape.block_size;
  const int residual_block_size = forked.residual_block_size;
  const int32_t context_length = sequence.num_computed_tokens + first_query + num_queries;
  const int64_t first_row = static_cast<int64_t>(sequence.token_offset) + first_query;

  for (int32_t tile_start = 0; tile_start < context_length; tile_start += kTileEntries) {
    const int32_t tile_count = std::min(kTileEntries, context_length - tile_start);
    // Stage 1: gather bV, rV and rebuild K = bK + RoPE_j(s_k · rK · B_k^T).
    for (int32_t e = 0; e < tile_count; ++e) {
      const int32_t j = tile_start + e;
      const int64_t slot = static_cast<int64_t>(block_table[j / block_size]) * block_size + j % block_size;
      const float* residual = forked.residual_pool +
                              (static_cast<int64_t>(residual_table[j / residual_block_size]) * residual_block_size +
                               j % residual_block_size) *
                                  residual_floats;
      float* key = s.keys + static_cast<int64_t>(e) * head_dim;
      std::memcpy(key, k_pool + slot * slot_floats + head_offset, static_cast<size_t>(head_dim) * sizeof(float));
      std::memcpy(s.values + static_cast<int64_t>(e) * head_dim, v_pool + slot * slot_floats + head_offset,
                  static_cast<size_t>(head_dim) * sizeof(float));
      std::memcpy(s.residual_values + e * v_rank, residual + max_rank, static_cast<size_t>(v_rank) * sizeof(float));
      if (k_rank == 0) continue;
      float* lora_key = s.lora_key;
      std::fill(lora_key, lora_key + head_dim, 0.0f);
      for (int64_t r = 0; r < k_rank; ++r) {
        const float weight = residual[r];
        const float* up = s.key_up_transposed + r * head_dim;
#pragma omp simd
        for (int d = 0; d < head_dim; ++d) lora_key[d] += weight * up[d];
      }
      forked.rope->rotate(lora_key, 1, forked.rope_cos + j * half, forked.rope_sin + j * half);
#pragma omp simd
      for (int d = 0; d < head_dim; ++d) key[d] += lora_key[d];
    }

    // Stage 2: scores, online softmax, P·bV and P·rV, one query head of the group at a time.
    for (int h = 0; h < heads_per_kv_head; ++h) {
      const int head = kv_head * heads_per_kv_head + h;
      const float* queries = q + first_row * q_size + static_cast<int64_t>(head) * head_dim;
      float* scores = s.scores + static_cast<int64_t>(h) * num_queries * kTileEntries;
      if (use_gemm)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, num_queries, tile_count, head_dim, scale, queries,
                    static_cast<int>(q_size), s.keys, head_dim, 0.0f, scores, kTileEntries);
      for (int32_t i = 0; i < num_queries; ++i) {
        const int64_t vector = static_cast<int64_t>(h) * num_queries + i;
        float* row = scores + static_cast<int64_t>(i) * kTileEntries;
        const int32_t visible = sequence.num_computed_tokens + first_query + i + 1;
        const int32_t count = std::clamp(visible - tile_start, 0, tile_count);
        if (!use_gemm)
          for (int32_t e = 0; e < count; ++e)
            row[e] = dot(queries + static_cast<int64_t>(i) * q_size, s.keys + static_cast<int64_t>(e) * head_dim,
                         head_dim) *
                     scale;
        std::fill(row + count, row + tile_count, 0.0f);  // causal mask: no weight
        if (count == 0) continue;
        float tile_max = -std::numeric_limits<float>::infinity();
        for (int32_t e = 0; e < count; ++e) tile_max = std::max(tile_max, row[e]);
        const float new_max = std::max(s.running_max[vector], tile_max);
        const float correction = std::exp(s.running_max[vector] - new_max);
        s.running_sum[vector] = s.running_sum[vector] * correction + exp_shifted_in_place(row, count, new_max);
        s.running_max[vector] = new_max;
        float* accumulated = s.accumulated_values + vector * head_dim;
        float* residual = s.accumulated_residual + vector * max_rank;
#pragma omp simd
        for (int d = 0; d < head_dim; ++d) accumulated[d] *= correction;
        for (int64_t r = 0; r < v_rank; ++r) residual[r] *= correction;
        if (use_gemm) continue;
        for (int32_t e = 0; e < count; ++e) {
          const float weight = row[e];
          const float* value = s.values + static_cast<int64_t>(e) * head_dim;
#pragma omp simd
          for (int d = 0; d < head_dim; ++d) accumulated[d] += weight * value[d];
          const float* residual_value = s.residual_values + e * v_rank;
#pragma omp simd
          for (int64_t r = 0; r < v_rank; ++r) residual[r] += weight * residual_value[r];
        }
      }
      if (!use_gemm) continue;
      const int64_t first_vector = static_cast<int64_t>(h) * num_queries;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, num_queries, head_dim, tile_count, 1.0f, scores,
                  kTileEntries, s.values, head_dim, 1.0f, s.accumulated_values + first_vector * head_dim, head_dim);
      if (v_rank > 0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, num_queries, static_cast<int>(v_rank), tile_count,
                    1.0f, scores, kTileEntries, s.residual_values, static_cast<int>(v_rank), 1.0f,
                    s.accumulated_residual + first_vector * max_rank, max_rank);
    }
  }

  // Stage 3: out = (Σ p bV + (Σ p rV) · s_v B_v^T) / Σ p.
  const float* v_up = v_module != nullptr ? v_module->b.data + head_offset * v_rank : nullptr;
  for (int h = 0; h < heads_per_kv_head; ++h) {
    const int head = kv_head * heads_per_kv_head + h;
    for (int32_t i = 0; i < num_queries; ++i) {
      const int64_t vector = static_cast<int64_t>(h) * num_queries + i;
      float* output = out + (first_row + i) * q_size + static_cast<int64_t>(head) * head_dim;
      const float* accumulated = s.accumulated_values + vector * head_dim;
      const float* residual = s.accumulated_residual + vector * max_rank;
      const float inverse_sum = 1.0f / s.running_sum[vector];
      for (int d = 0; d < head_dim; ++d) {
        const float up = v_rank > 0 ? v_module->scale * dot(v_up + d * v_rank, residual, v_rank) : 0.0f;
        output[d] = (accumulated[d] + up) * inverse_sum;
      }
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
    const int32_t first = std::max(0, sequence.num_residual_present_tokens - sequence.num_computed_tokens);
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
