#include "backend/cpu/paged_attention.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/grouped_attention.h"
#include "backend/cpu/residual_attention.h"

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

// Queries per chunk at most (the forked path's chunks are at least 16).
constexpr int32_t kMaxChunkQueries = 64;

// Queries [first_query, first_query + num_queries) of one sequence, and the
// decoder rows paired with them, all query heads sharing `kv_head`, in one
// grouped pass (grouped_attention.h). Query i sees KV entries 0 .. num_cached + i.
void attend_chunk(const float* q, const BatchSequence& sequence, const int32_t* block_table,
                  const TokenPlacement& placement, int32_t first_query, int32_t num_queries,
                  const AttentionShape& shape, int kv_head, const float* k_pool, const float* v_pool,
                  float* scratch, float* out) {
  const int head_dim = shape.head_dim;
  const int64_t q_size = static_cast<int64_t>(shape.num_heads) * head_dim;
  // Decoder rows belong to a suffix of the sequence's tokens, in token order.
  const int64_t first_row = static_cast<int64_t>(sequence.token_offset) + first_query;
  int32_t first_decoded = num_queries;
  if (!placement.decoder_row_of_token.empty())
    while (first_decoded > 0 && placement.decoder_row_of_token[first_row + first_decoded - 1] >= 0) --first_decoded;

  // Rows of one head side by side (similar num_visible), flushed kMaxGroupedRows at a time.
  QueryRow rows[kMaxGroupedRows];
  int32_t num_rows = 0;
  auto add_row = [&](int64_t row, int64_t head_offset, int32_t query) {
    rows[num_rows++] = {q + row * q_size + head_offset, out + row * q_size + head_offset,
                        sequence.num_computed_tokens + first_query + query + 1};
    if (num_rows < kMaxGroupedRows) return;
    attend_grouped_rows({rows, static_cast<size_t>(num_rows)}, block_table, shape, kv_head, k_pool, v_pool, scratch);
    num_rows = 0;
  };
  const int heads_per_kv_head = shape.num_heads / shape.num_kv_heads;
  for (int head = kv_head * heads_per_kv_head; head < (kv_head + 1) * heads_per_kv_head; ++head) {
    const int64_t head_offset = static_cast<int64_t>(head) * head_dim;
    for (int32_t i = 0; i < num_queries; ++i) add_row(first_row + i, head_offset, i);
    for (int32_t i = first_decoded; i < num_queries; ++i)
      add_row(placement.decoder_row_of_token[first_row + i], head_offset, i);
  }
  if (num_rows > 0)
    attend_grouped_rows({rows, static_cast<size_t>(num_rows)}, block_table, shape, kv_head, k_pool, v_pool, scratch);
}

// A unit of parallel work: a chunk of queries of one sequence and all the
// query heads of one kv head (and their decoder rows), or the same through
// ResidualAttention for a forked sequence.
struct WorkItem {
  int32_t sequence = 0;
  int32_t kv_head = 0;
  int32_t first_query = 0;
  int32_t num_queries = 0;
  bool forked = false;
};

}  // namespace

void paged_attention(const float* q, const Batch& batch, const TokenPlacement& placement,
                     const AttentionShape& shape, const float* k_pool, const float* v_pool,
                     int num_threads, std::vector<float>& scratch, float* out, const ForkedAttention* forked) {
  // Query chunks: at most kMaxChunkQueries, small enough for about two work
  // items per thread (a 14-token tail, 3 kv heads, 2 threads: 6 items of 7
  // queries). A sequence's chunks are of equal size (give or take one), so
  // that items of one sequence take about equally long.
  const int64_t num_queries = batch.num_tokens();
  const int64_t num_wanted_items = 2 * std::max(num_threads, 1);
  const int64_t wanted_chunk = (num_queries * shape.num_kv_heads + num_wanted_items - 1) / num_wanted_items;
  const int32_t chunk = static_cast<int32_t>(std::clamp<int64_t>(wanted_chunk, 1, kMaxChunkQueries));
  // ForkKV rebuilds K per kv head and tile: its chunks stay at 16 or more.
  const int32_t forked_min_chunk = static_cast<int32_t>(std::clamp<int64_t>((wanted_chunk + 7) / 8 * 8, 16, 64));

  std::vector<WorkItem> items;
  bool has_chunks = false;
  int32_t max_forked_queries = 0;
  for (int32_t s = 0; s < static_cast<int32_t>(batch.sequences.size()); ++s) {
    const BatchSequence& sequence = batch.sequences[s];
    const int32_t num_new = sequence.num_new_tokens;
    if (sequence.forked_adapter_slot >= 0) {
      // Rebuilding K costs per kv head and tile: serve all of a group's query heads at once.
      const int32_t forked_chunk = num_new == 1 ? 1 : forked_min_chunk;
      max_forked_queries = std::max(max_forked_queries, forked_chunk);
      for (int32_t first = (num_new - 1) / forked_chunk * forked_chunk; first >= 0; first -= forked_chunk)
        for (int32_t kv_head = 0; kv_head < shape.num_kv_heads; ++kv_head)
          items.push_back({s, kv_head, first, std::min(forked_chunk, num_new - first), true});
      continue;
    }
    has_chunks = true;
    const int32_t num_chunks = (num_new + chunk - 1) / chunk;
    // Last chunks first: they see the most keys, and dynamic scheduling then balances.
    for (int32_t c = num_chunks - 1; c >= 0; --c) {
      const int32_t first = static_cast<int32_t>(int64_t{num_new} * c / num_chunks);
      const int32_t end = static_cast<int32_t>(int64_t{num_new} * (c + 1) / num_chunks);
      for (int32_t kv_head = 0; kv_head < shape.num_kv_heads; ++kv_head)
        items.push_back({s, kv_head, first, end - first, false});
    }
  }

  int64_t scratch_per_thread = 0;
  if (has_chunks) scratch_per_thread = grouped_attention_scratch_floats(shape, placement.max_context_length);
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
    float* thread_scratch = scratch.data() + omp_get_thread_num() * scratch_per_thread;
    if (item.forked) {
      residual_attend(q, batch, sequence, item.first_query, item.num_queries, shape, item.kv_head, k_pool, v_pool,
                      *forked, thread_scratch, out);
    } else {
      attend_chunk(q, sequence, batch.block_tables.data() + sequence.block_table_offset, placement, item.first_query,
                   item.num_queries, shape, item.kv_head, k_pool, v_pool, thread_scratch, out);
    }
  }
}

}  // namespace loom::cpu
