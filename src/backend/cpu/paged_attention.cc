#include "backend/cpu/paged_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace loom::cpu {

void place_tokens(const Batch& batch, int block_size, TokenPlacement& placement) {
  const int32_t num_tokens = batch.num_tokens();
  placement.sequence_of_token.resize(num_tokens);
  placement.slot_of_token.resize(num_tokens);
  placement.max_context_length = 0;
  placement.num_attended_entries = 0;
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const BatchSequence& sequence = batch.sequences[s];
    const int32_t* block_table = batch.block_tables.data() + sequence.block_table_offset;
    for (int32_t i = 0; i < sequence.num_new_tokens; ++i) {
      const int32_t token = sequence.token_offset + i;
      const int32_t kv_index = sequence.num_cached_tokens + i;
      placement.sequence_of_token[token] = static_cast<int32_t>(s);
      placement.slot_of_token[token] =
          static_cast<int64_t>(block_table[kv_index / block_size]) * block_size + kv_index % block_size;
    }
    const int64_t context_length = sequence.num_cached_tokens + sequence.num_new_tokens;
    placement.max_context_length = std::max(placement.max_context_length, static_cast<int32_t>(context_length));
    // Token i attends to num_cached + i + 1 entries.
    const int64_t num_new = sequence.num_new_tokens;
    placement.num_attended_entries += num_new * (sequence.num_cached_tokens + 1) + num_new * (num_new - 1) / 2;
  }
}

void write_kv(const float* k, const float* v, const TokenPlacement& placement, int64_t slot_floats,
              float* k_pool, float* v_pool) {
  const size_t row_bytes = static_cast<size_t>(slot_floats) * sizeof(float);
  for (size_t token = 0; token < placement.slot_of_token.size(); ++token) {
    const int64_t slot = placement.slot_of_token[token];
    std::memcpy(k_pool + slot * slot_floats, k + token * slot_floats, row_bytes);
    std::memcpy(v_pool + slot * slot_floats, v + token * slot_floats, row_bytes);
  }
}

namespace {

float dot(const float* a, const float* b, int count) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int i = 0; i < count; ++i) sum += a[i] * b[i];
  return sum;
}

// One query head of one token over its sequence's first `context_length` KV entries.
void attend_one(const float* query, const int32_t* block_table, int32_t context_length,
                const AttentionShape& shape, int kv_head, const float* k_pool, const float* v_pool,
                float* scores, float* out) {
  const int head_dim = shape.head_dim;
  const int block_size = shape.block_size;
  const int64_t slot_floats = shape.slot_floats();
  const int64_t head_offset = static_cast<int64_t>(kv_head) * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));

  float max_score = -std::numeric_limits<float>::infinity();
  for (int32_t start = 0, block = 0; start < context_length; start += block_size, ++block) {
    const int32_t count = std::min(block_size, context_length - start);
    const float* keys = k_pool + static_cast<int64_t>(block_table[block]) * block_size * slot_floats +
                        head_offset;
    for (int32_t j = 0; j < count; ++j) {
      const float score = dot(query, keys + j * slot_floats, head_dim) * scale;
      scores[start + j] = score;
      max_score = std::max(max_score, score);
    }
  }
  float sum = 0.0f;
  for (int32_t j = 0; j < context_length; ++j) {
    scores[j] = std::exp(scores[j] - max_score);
    sum += scores[j];
  }
  const float inverse_sum = 1.0f / sum;

  std::fill(out, out + head_dim, 0.0f);
  for (int32_t start = 0, block = 0; start < context_length; start += block_size, ++block) {
    const int32_t count = std::min(block_size, context_length - start);
    const float* values = v_pool + static_cast<int64_t>(block_table[block]) * block_size * slot_floats +
                          head_offset;
    for (int32_t j = 0; j < count; ++j) {
      const float weight = scores[start + j] * inverse_sum;
      const float* value = values + j * slot_floats;
#pragma omp simd
      for (int d = 0; d < head_dim; ++d) out[d] += weight * value[d];
    }
  }
}

}  // namespace

void paged_attention(const float* q, const Batch& batch, const TokenPlacement& placement,
                     const AttentionShape& shape, const float* k_pool, const float* v_pool,
                     int num_threads, std::vector<float>& scores_scratch, float* out) {
  const int64_t num_tokens = batch.num_tokens();
  const int num_heads = shape.num_heads;
  const int64_t q_size = static_cast<int64_t>(num_heads) * shape.head_dim;
  const int heads_per_kv_head = num_heads / shape.num_kv_heads;
  const int64_t scratch_per_thread = std::max<int32_t>(placement.max_context_length, 1);
  scores_scratch.resize(static_cast<size_t>(num_threads) * scratch_per_thread);

  const int64_t num_units = num_tokens * num_heads;
  // Multiply-adds of the whole call; small steps run on the calling thread.
  const int64_t work = placement.num_attended_entries * num_heads * shape.head_dim;
  constexpr int64_t kMinWorkForThreads = 128 * 1024;
#pragma omp parallel for schedule(dynamic, 4) num_threads(num_threads) if (work >= kMinWorkForThreads)
  for (int64_t unit = 0; unit < num_units; ++unit) {
    const int64_t token = unit / num_heads;
    const int head = static_cast<int>(unit % num_heads);
    const BatchSequence& sequence = batch.sequences[placement.sequence_of_token[token]];
    const int32_t context_length = sequence.num_cached_tokens +
                                   static_cast<int32_t>(token - sequence.token_offset) + 1;
    float* scores = scores_scratch.data() + omp_get_thread_num() * scratch_per_thread;
    attend_one(q + token * q_size + static_cast<int64_t>(head) * shape.head_dim,
               batch.block_tables.data() + sequence.block_table_offset, context_length, shape,
               head / heads_per_kv_head, k_pool, v_pool, scores,
               out + token * q_size + static_cast<int64_t>(head) * shape.head_dim);
  }
}

}  // namespace loom::cpu
