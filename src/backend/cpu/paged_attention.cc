#include "backend/cpu/paged_attention.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/residual_attention.h"
#include "backend/cpu/vector_math.h"

namespace loom::cpu {

void place_tokens(const Batch& batch, int block_size, TokenPlacement& placement, int residual_block_size) {
  const int32_t num_tokens = batch.num_tokens();
  placement.sequence_of_token.resize(num_tokens);
  placement.slot_of_token.resize(num_tokens);
  placement.residual_slot_of_token.clear();
  placement.decoder_row_of_token.clear();
  placement.token_of_decoder_row.clear();
  placement.max_context_length = 0;
  placement.max_forked_context_length = 0;
  placement.num_attended_entries = 0;
  placement.has_forked_sequences = false;
  for (const BatchSequence& sequence : batch.sequences) {
    if (sequence.forked_adapter_slot >= 0) placement.has_forked_sequences = true;
    if (sequence.decoder_adapter_slot >= 0 && placement.decoder_row_of_token.empty())
      placement.decoder_row_of_token.assign(num_tokens, -1);
  }
  if (placement.has_forked_sequences) placement.residual_slot_of_token.assign(num_tokens, -1);

  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const BatchSequence& sequence = batch.sequences[s];
    const int32_t* block_table = batch.block_tables.data() + sequence.block_table_offset;
    const int32_t* residual_table = batch.residual_block_tables.data() + sequence.residual_block_table_offset;
    const bool is_forked = sequence.forked_adapter_slot >= 0;
    for (int32_t i = 0; i < sequence.num_new_tokens; ++i) {
      const int32_t token = sequence.token_offset + i;
      const int32_t kv_index = sequence.num_computed_tokens + i;
      placement.sequence_of_token[token] = static_cast<int32_t>(s);
      placement.slot_of_token[token] =
          kv_index < sequence.num_kv_present_tokens
              ? -1
              : static_cast<int64_t>(block_table[kv_index / block_size]) * block_size + kv_index % block_size;
      if (is_forked && kv_index >= sequence.num_residual_present_tokens)
        placement.residual_slot_of_token[token] =
            static_cast<int64_t>(residual_table[kv_index / residual_block_size]) * residual_block_size +
            kv_index % residual_block_size;
    }
    const int64_t context_length = sequence.num_computed_tokens + sequence.num_new_tokens;
    placement.max_context_length = std::max(placement.max_context_length, static_cast<int32_t>(context_length));
    if (is_forked)
      placement.max_forked_context_length =
          std::max(placement.max_forked_context_length, static_cast<int32_t>(context_length));
    // Token i attends to num_cached + i + 1 entries.
    const int64_t num_new = sequence.num_new_tokens;
    placement.num_attended_entries += num_new * (sequence.num_computed_tokens + 1) + num_new * (num_new - 1) / 2;

    if (sequence.decoder_adapter_slot < 0) continue;
    // One decoder row per logits token: the last, or all of them.
    const int32_t first_logits = sequence.logits_for_all_tokens ? 0 : sequence.num_new_tokens - 1;
    for (int32_t i = first_logits; i < sequence.num_new_tokens; ++i) {
      const int32_t token = sequence.token_offset + i;
      placement.decoder_row_of_token[token] = num_tokens + placement.num_decoder_rows();
      placement.token_of_decoder_row.push_back(token);
      placement.num_attended_entries += sequence.num_computed_tokens + i + 1;
    }
  }
}

void write_kv(const float* k, const float* v, const TokenPlacement& placement, int64_t slot_floats,
              float* k_pool, float* v_pool) {
  const size_t row_bytes = static_cast<size_t>(slot_floats) * sizeof(float);
  for (size_t token = 0; token < placement.slot_of_token.size(); ++token) {
    const int64_t slot = placement.slot_of_token[token];
    if (slot < 0) continue;
    std::memcpy(k_pool + slot * slot_floats, k + token * slot_floats, row_bytes);
    std::memcpy(v_pool + slot * slot_floats, v + token * slot_floats, row_bytes);
  }
}

namespace {

// Sequences with at least this many new tokens (prefill chunks) run their
// attention as GEMMs over chunks of queries, which read each kv head's entries
// once for all the chunk's queries and the query heads sharing it; single
// tokens (decode) run token by token. Token by token, a warm prefix's short
// tail re-read the whole cached context once per token and query head: 10 new
// tokens over a 2K cached prefix cost 0.16 s against 0.05 s cold (SmolLM2).
constexpr int32_t kMinQueriesForGemm = 2;

float dot(const float* a, const float* b, int count) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int i = 0; i < count; ++i) sum += a[i] * b[i];
  return sum;
}

// scores[0, length) -> softmax in place (max-shifted, fp32 sum).
void softmax_in_place(float* scores, int64_t length) {
  float max_score = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < length; ++j) max_score = std::max(max_score, scores[j]);
  const float inverse_sum = 1.0f / exp_shifted_in_place(scores, length, max_score);
#pragma omp simd
  for (int64_t j = 0; j < length; ++j) scores[j] *= inverse_sum;
}

// kRows query heads that read the same kv head over the same first
// `context_length` KV entries: one token's head (kRows 1), or a token's head and
// its decoder row's (kRows 2: one pass over K and V serves both rows).
// scores: kRows * context_length floats.
template <int kRows>
void attend_rows(const float* const (&queries)[kRows], const int32_t* block_table, int32_t context_length,
                 const AttentionShape& shape, int kv_head, const float* k_pool, const float* v_pool,
                 float* scores, float* const (&outs)[kRows]) {
  const int head_dim = shape.head_dim;
  const int block_size = shape.block_size;
  const int64_t slot_floats = shape.slot_floats();
  const int64_t head_offset = static_cast<int64_t>(kv_head) * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));

  for (int32_t start = 0, block = 0; start < context_length; start += block_size, ++block) {
    const int32_t count = std::min(block_size, context_length - start);
    const float* keys = k_pool + static_cast<int64_t>(block_table[block]) * block_size * slot_floats +
                        head_offset;
    for (int32_t j = 0; j < count; ++j)
      for (int r = 0; r < kRows; ++r)
        scores[r * context_length + start + j] = dot(queries[r], keys + j * slot_floats, head_dim) * scale;
  }
  for (int r = 0; r < kRows; ++r) {
    softmax_in_place(scores + r * context_length, context_length);
    std::fill(outs[r], outs[r] + head_dim, 0.0f);
  }

  for (int32_t start = 0, block = 0; start < context_length; start += block_size, ++block) {
    const int32_t count = std::min(block_size, context_length - start);
    const float* values = v_pool + static_cast<int64_t>(block_table[block]) * block_size * slot_floats +
                          head_offset;
    for (int32_t j = 0; j < count; ++j) {
      const float* value = values + j * slot_floats;
      for (int r = 0; r < kRows; ++r) {
        const float weight = scores[r * context_length + start + j];
        float* out = outs[r];
#pragma omp simd
        for (int d = 0; d < head_dim; ++d) out[d] += weight * value[d];
      }
    }
  }
}

// Copies kv head `kv_head` of KV entries [0, context_length) into dense
// [context_length, head_dim] matrices, so that attention can use sgemm.
void gather_kv(const int32_t* block_table, int32_t context_length, const AttentionShape& shape, int kv_head,
               const float* k_pool, const float* v_pool, float* keys, float* values) {
  const int head_dim = shape.head_dim;
  const int64_t slot_floats = shape.slot_floats();
  const size_t row_bytes = static_cast<size_t>(head_dim) * sizeof(float);
  for (int32_t j = 0; j < context_length; ++j) {
    const int64_t slot = static_cast<int64_t>(block_table[j / shape.block_size]) * shape.block_size +
                         j % shape.block_size;
    const int64_t source = slot * slot_floats + static_cast<int64_t>(kv_head) * head_dim;
    std::memcpy(keys + static_cast<int64_t>(j) * head_dim, k_pool + source, row_bytes);
    std::memcpy(values + static_cast<int64_t>(j) * head_dim, v_pool + source, row_bytes);
  }
}

// One query head of `num_queries` consecutive rows (rows `ld` floats apart) over
// dense K/V: S = scale * Q K^T (sgemm), causal softmax per row (row r sees
// first_visible + r entries; the rest of S is zeroed so P V can run over all
// `context_length` entries), O = P V (sgemm).
void attend_dense(const float* queries, int64_t ld, int32_t num_queries, int32_t first_visible,
                  int32_t context_length, int head_dim, const float* keys, const float* values, float* scores,
                  float* out) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, num_queries, context_length, head_dim, scale, queries,
              static_cast<int>(ld), keys, head_dim, 0.0f, scores, context_length);
  for (int32_t r = 0; r < num_queries; ++r) {
    float* row = scores + static_cast<int64_t>(r) * context_length;
    const int32_t visible = first_visible + r;
    softmax_in_place(row, visible);
    std::fill(row + visible, row + context_length, 0.0f);
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, num_queries, head_dim, context_length, 1.0f, scores,
              context_length, values, head_dim, 0.0f, out, static_cast<int>(ld));
}

// Queries [first_query, first_query + num_queries) of one sequence, and the
// decoder rows paired with them, all query heads sharing `kv_head`. Query i
// sees KV entries 0 .. num_cached + i.
void attend_chunk(const float* q, const BatchSequence& sequence, const int32_t* block_table,
                  const TokenPlacement& placement, int32_t first_query, int32_t num_queries,
                  const AttentionShape& shape, int kv_head, const float* k_pool, const float* v_pool,
                  float* scratch, int64_t max_context, float* out) {
  const int head_dim = shape.head_dim;
  const int64_t q_size = static_cast<int64_t>(shape.num_heads) * head_dim;
  const int32_t context_length = sequence.num_computed_tokens + first_query + num_queries;
  float* keys = scratch;
  float* values = keys + max_context * head_dim;
  float* scores = values + max_context * head_dim;
  gather_kv(block_table, context_length, shape, kv_head, k_pool, v_pool, keys, values);

  // Decoder rows belong to a suffix of the sequence's tokens, in token order.
  const int64_t first_row = static_cast<int64_t>(sequence.token_offset) + first_query;
  int32_t first_decoded = num_queries;
  if (!placement.decoder_row_of_token.empty())
    while (first_decoded > 0 && placement.decoder_row_of_token[first_row + first_decoded - 1] >= 0) --first_decoded;
  const int32_t num_decoded = num_queries - first_decoded;

  const int heads_per_kv_head = shape.num_heads / shape.num_kv_heads;
  for (int head = kv_head * heads_per_kv_head; head < (kv_head + 1) * heads_per_kv_head; ++head) {
    const int64_t head_offset = static_cast<int64_t>(head) * head_dim;
    attend_dense(q + first_row * q_size + head_offset, q_size, num_queries,
                 sequence.num_computed_tokens + first_query + 1, context_length, head_dim, keys, values, scores,
                 out + first_row * q_size + head_offset);
    if (num_decoded == 0) continue;
    const int64_t decoder_row = placement.decoder_row_of_token[first_row + first_decoded];
    attend_dense(q + decoder_row * q_size + head_offset, q_size, num_decoded,
                 sequence.num_computed_tokens + first_query + first_decoded + 1, context_length, head_dim, keys,
                 values, scores, out + decoder_row * q_size + head_offset);
  }
}

enum class WorkKind : uint8_t { kToken, kChunk, kForked };

// A unit of parallel work: one token and query head (kToken; head is a query
// head), or a chunk of queries of one kv head's group (kChunk, kForked; head is
// a kv head).
struct WorkItem {
  int32_t sequence = 0;
  int32_t head = 0;
  int32_t first_query = 0;
  int32_t num_queries = 0;
  WorkKind kind = WorkKind::kToken;
};

}  // namespace

void paged_attention(const float* q, const Batch& batch, const TokenPlacement& placement,
                     const AttentionShape& shape, const float* k_pool, const float* v_pool,
                     int num_threads, std::vector<float>& scratch, float* out, const ForkedAttention* forked) {
  const int64_t q_size = static_cast<int64_t>(shape.num_heads) * shape.head_dim;
  const int heads_per_kv_head = shape.num_heads / shape.num_kv_heads;

  // Query chunks: large enough for efficient GEMMs, small enough for about two
  // work items per thread.
  int64_t num_chunked_queries = 0;
  for (const BatchSequence& sequence : batch.sequences)
    if (sequence.num_new_tokens >= kMinQueriesForGemm) num_chunked_queries += sequence.num_new_tokens;
  const int64_t wanted_chunk = num_chunked_queries * shape.num_kv_heads / (2 * std::max(num_threads, 1));
  const int32_t chunk = static_cast<int32_t>(std::clamp<int64_t>((wanted_chunk + 7) / 8 * 8, 16, 64));

  std::vector<WorkItem> items;
  bool has_gemm_chunks = false;
  int32_t max_forked_queries = 0;
  for (int32_t s = 0; s < static_cast<int32_t>(batch.sequences.size()); ++s) {
    const BatchSequence& sequence = batch.sequences[s];
    const int32_t num_new = sequence.num_new_tokens;
    if (sequence.forked_adapter_slot >= 0) {
      // Rebuilding K costs per kv head and tile: serve all of a group's query heads at once.
      const int32_t forked_chunk = num_new < kMinQueriesForGemm ? num_new : chunk;
      max_forked_queries = std::max(max_forked_queries, forked_chunk);
      for (int32_t first = (num_new - 1) / forked_chunk * forked_chunk; first >= 0; first -= forked_chunk)
        for (int32_t kv_head = 0; kv_head < shape.num_kv_heads; ++kv_head)
          items.push_back({s, kv_head, first, std::min(forked_chunk, num_new - first), WorkKind::kForked});
      continue;
    }
    if (num_new < kMinQueriesForGemm) {
      for (int32_t i = 0; i < num_new; ++i)
        for (int32_t head = 0; head < shape.num_heads; ++head) items.push_back({s, head, i, 1, WorkKind::kToken});
      continue;
    }
    has_gemm_chunks = true;
    // Last chunks first: they see the most keys, and dynamic scheduling then balances.
    for (int32_t first = (num_new - 1) / chunk * chunk; first >= 0; first -= chunk)
      for (int32_t kv_head = 0; kv_head < shape.num_kv_heads; ++kv_head)
        items.push_back({s, kv_head, first, std::min(chunk, num_new - first), WorkKind::kChunk});
  }

  const int64_t max_context = std::max<int32_t>(placement.max_context_length, 1);
  const int64_t rows_per_token = placement.num_decoder_rows() > 0 ? 2 : 1;
  int64_t scratch_per_thread = rows_per_token * max_context;
  if (has_gemm_chunks) scratch_per_thread = std::max(scratch_per_thread, max_context * (2 * shape.head_dim + chunk));
  if (max_forked_queries > 0)
    scratch_per_thread = std::max(
        scratch_per_thread, residual_attention_scratch_floats(shape, max_forked_queries, forked->max_rank));
  if (scratch.size() < static_cast<size_t>(num_threads * scratch_per_thread))
    scratch.resize(static_cast<size_t>(num_threads * scratch_per_thread));

  // Multiply-adds of the whole call; small steps run on the calling thread.
  const int64_t work = placement.num_attended_entries * shape.num_heads * shape.head_dim;
  constexpr int64_t kMinWorkForThreads = 128 * 1024;
  const int64_t num_items = static_cast<int64_t>(items.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads) if (work >= kMinWorkForThreads)
  for (int64_t index = 0; index < num_items; ++index) {
    const WorkItem& item = items[index];
    const BatchSequence& sequence = batch.sequences[item.sequence];
    const int32_t* block_table = batch.block_tables.data() + sequence.block_table_offset;
    float* thread_scratch = scratch.data() + omp_get_thread_num() * scratch_per_thread;
    switch (item.kind) {
      case WorkKind::kForked:
        residual_attend(q, batch, sequence, item.first_query, item.num_queries, shape, item.head, k_pool, v_pool,
                        *forked, thread_scratch, out);
        break;
      case WorkKind::kChunk:
        attend_chunk(q, sequence, block_table, placement, item.first_query, item.num_queries, shape, item.head,
                     k_pool, v_pool, thread_scratch, max_context, out);
        break;
      case WorkKind::kToken: {
        const int64_t token = sequence.token_offset + item.first_query;
        const int64_t head_offset = static_cast<int64_t>(item.head) * shape.head_dim;
        const int32_t context_length = sequence.num_computed_tokens + item.first_query + 1;
        const int kv_head = item.head / heads_per_kv_head;
        const int64_t decoder_row =
            placement.decoder_row_of_token.empty() ? -1 : placement.decoder_row_of_token[token];
        if (decoder_row < 0) {
          const float* const queries[1] = {q + token * q_size + head_offset};
          float* const outs[1] = {out + token * q_size + head_offset};
          attend_rows<1>(queries, block_table, context_length, shape, kv_head, k_pool, v_pool, thread_scratch, outs);
        } else {
          const float* const queries[2] = {q + token * q_size + head_offset, q + decoder_row * q_size + head_offset};
          float* const outs[2] = {out + token * q_size + head_offset, out + decoder_row * q_size + head_offset};
          attend_rows<2>(queries, block_table, context_length, shape, kv_head, k_pool, v_pool, thread_scratch, outs);
        }
        break;
      }
    }
  }
}

}  // namespace loom::cpu
