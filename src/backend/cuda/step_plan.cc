#include "backend/cuda/step_plan.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "util/error.h"

namespace loom::cuda {

namespace {

struct TileCandidate {
  int32_t sequence = 0;
  int32_t row_begin = 0;
  int32_t num_rows = 0;
  int32_t kv_end = 0;   // causal limit of the tile's last row
  int32_t num_key_tiles = 0;
};

// Splits below this many key tiles per chunk cost more in combining than they gain.
constexpr int32_t kMinKeyTilesPerChunk = 2;
constexpr int32_t kMinDecodeTilesPerChunk = 4;

// Decode chunk length by wave quantisation: a chunk of c tiles costs about
// c + 1 tile-times (the prologue), and the grid runs in ceil(CTAs / slots)
// waves. Of the lengths from the minimum up to the longest item, the one with
// the fewest wave-tile-times wins (ties: the longer, fewer partials; figures:
// bench/README.md, "The measurements behind the CUDA defaults").
int32_t wave_aware_chunk(const std::vector<TileCandidate>& list, int64_t slots, int32_t num_kv_heads) {
  int32_t longest = 0;
  for (const TileCandidate& c : list) longest = std::max(longest, c.num_key_tiles);
  const int32_t last = std::max(kMinDecodeTilesPerChunk, longest);
  int32_t best = last;
  int64_t best_cost = INT64_MAX;
  for (int32_t chunk = kMinDecodeTilesPerChunk; chunk <= last; ++chunk) {
    int64_t items = 0;
    for (const TileCandidate& c : list) items += (c.num_key_tiles + chunk - 1) / chunk;
    const int64_t waves = (items * num_kv_heads + slots - 1) / slots;
    const int64_t cost = waves * (std::min(chunk, longest) + 1);
    if (cost <= best_cost) {
      best_cost = cost;
      best = chunk;
    }
  }
  return best;
}

}  // namespace

int32_t graph_capacity(int32_t n) {
  if (n <= 0) return 0;
  int32_t capacity = 1;
  while (capacity < n && capacity < 4) capacity *= 2;
  if (capacity >= n) return capacity;
  // 4, 6, 8, 12, 16, 24, ...: each power of two, then 1.5x it.
  for (int32_t power = 4;; power *= 2) {
    if (power >= n) return power;
    if (power / 2 * 3 >= n) return power / 2 * 3;
  }
}

GraphListFloors graph_list_floors(int32_t rows, const PlanShape& shape) {
  // Split-KV decode (plan_attention) aims at one wave of items when the rows alone leave SMs idle.
  auto decode_floor = [&](int32_t ctas_per_sm) {
    if (static_cast<int64_t>(rows) * shape.num_kv_heads >= 8LL * shape.num_sms) return rows;
    const int64_t slots = static_cast<int64_t>(shape.num_sms) * (ctas_per_sm > 0 ? ctas_per_sm : 32);
    return static_cast<int32_t>(std::max<int64_t>(rows, (slots + shape.num_kv_heads - 1) / shape.num_kv_heads));
  };
  GraphListFloors floors;
  floors.decode_items = decode_floor(shape.decode_ctas_per_sm);
  floors.forked_decode_items =
      decode_floor(shape.forked_decode_ctas_per_sm > 0 ? shape.forked_decode_ctas_per_sm : shape.decode_ctas_per_sm);
  floors.combine_items = rows;
  floors.lora_tiles = (rows + kLoraTileRows - 1) / kLoraTileRows + std::min(rows, 8);
  floors.logit_rows = rows;
  return floors;
}

void check_device_sampling(const Batch& batch) {
  if (batch.num_token_mask_rows < 0 || (batch.num_token_mask_rows > 0 && batch.sampling.empty()))
    fail(ErrorKind::kInvalidArgument, "batch: {} token mask rows need device sampling",
         batch.num_token_mask_rows);
  if (batch.sampling.empty()) return;
  if (batch.sampling.size() != batch.sequences.size())
    fail(ErrorKind::kInvalidArgument, "batch: {} sampling entries for {} sequences", batch.sampling.size(),
         batch.sequences.size());
  for (size_t s = 0; s < batch.sampling.size(); ++s) {
    const DeviceSampling& sampling = batch.sampling[s];
    if (!sampling.on_device) continue;
    if (!(sampling.temperature >= 0.0f) || !std::isfinite(sampling.temperature))
      fail(ErrorKind::kInvalidArgument, "batch sequence {}: temperature must be >= 0, got {}", s, sampling.temperature);
    if (sampling.top_k < 0) fail(ErrorKind::kInvalidArgument, "batch sequence {}: top_k must be >= 0, got {}", s, sampling.top_k);
    if (!(sampling.top_p > 0.0f && sampling.top_p <= 1.0f))
      fail(ErrorKind::kInvalidArgument, "batch sequence {}: top_p must be in (0, 1], got {}", s, sampling.top_p);
    if (batch.sequences[s].logits_for_all_tokens)
      fail(ErrorKind::kInvalidArgument, "batch sequence {}: device sampling with logits_for_all_tokens", s);
    if (!(sampling.repetition_penalty > 0.0f) || !std::isfinite(sampling.repetition_penalty) ||
        !(sampling.min_p >= 0.0f && sampling.min_p <= 1.0f))
      fail(ErrorKind::kInvalidArgument, "batch sequence {}: repetition_penalty {} (> 0) or min_p {} ([0, 1])", s,
           sampling.repetition_penalty, sampling.min_p);
    if (sampling.edits_begin < 0 || sampling.num_edits < 0 ||
        static_cast<size_t>(sampling.edits_begin) + static_cast<size_t>(sampling.num_edits) > batch.logit_edits.size())
      fail(ErrorKind::kInvalidArgument, "batch sequence {}: logit edits [{}, +{}) outside the batch's {}", s,
           sampling.edits_begin, sampling.num_edits, batch.logit_edits.size());
    if (sampling.mask_row >= batch.num_token_mask_rows)
      fail(ErrorKind::kInvalidArgument, "batch sequence {}: token mask row {} of {}", s, sampling.mask_row,
           batch.num_token_mask_rows);
  }
}

template <typename T>
void StepPlan::append(size_t& offset, const std::vector<T>& values) {
  static_assert(sizeof(T) % sizeof(int32_t) == 0, "plan entries are whole words");
  offset = (words_.size() + 3) / 4 * 4;  // 16-byte aligned sections
  const size_t num_words = values.size() * sizeof(T) / sizeof(int32_t);
  words_.resize(offset + num_words);
  if (num_words > 0) std::memcpy(words_.data() + offset, values.data(), num_words * sizeof(int32_t));
}

void StepPlan::place_rows(const Batch& batch, const PlanShape& shape, int32_t residual_block_size) {
  num_tokens_ = batch.num_tokens();
  row_token_ids_.assign(batch.token_ids.begin(), batch.token_ids.end());
  row_positions_.assign(batch.positions.begin(), batch.positions.end());
  row_adapter_slots_.assign(batch.adapter_slots.begin(), batch.adapter_slots.end());
  kv_slots_.assign(num_tokens_, -1);
  residual_slots_.assign(num_tokens_, -1);
  sequences_.clear();
  max_forked_context_ = 0;
  has_residual_writes_ = false;
  for (const BatchSequence& sequence : batch.sequences) {
    const int32_t* block_table = batch.block_tables.data() + sequence.block_table_offset;
    const int32_t* residual_table = batch.residual_block_tables.data() + sequence.residual_block_table_offset;
    const bool forked = sequence.forked_adapter_slot >= 0;
    for (int32_t i = 0; i < sequence.num_new_tokens; ++i) {
      const int32_t kv_index = sequence.num_computed_tokens + i;
      const int32_t token = sequence.token_offset + i;
      // Present entries (shared with other sequences) are read, never written.
      if (kv_index >= sequence.num_kv_present_tokens)
        kv_slots_[token] = block_table[kv_index / shape.block_size] * shape.block_size + kv_index % shape.block_size;
      if (!forked) continue;
      residual_slots_[token] = -2;
      if (kv_index < sequence.num_residual_present_tokens) continue;
      residual_slots_[token] =
          residual_table[kv_index / residual_block_size] * residual_block_size + kv_index % residual_block_size;
      has_residual_writes_ = true;
    }
    AttentionSequence placed{sequence.token_offset, sequence.num_computed_tokens, sequence.num_new_tokens,
                             sequence.block_table_offset};
    if (forked) {
      placed.forked_slot = sequence.forked_adapter_slot;
      placed.residual_block_table_offset =
          static_cast<int32_t>(batch.block_tables.size()) + sequence.residual_block_table_offset;
      max_forked_context_ = std::max(max_forked_context_, sequence.num_computed_tokens + sequence.num_new_tokens);
    }
    if (sequence.decoder_adapter_slot >= 0) {
      // One decoder row per logits token: the last new token, or all of them.
      const int32_t first = sequence.logits_for_all_tokens ? 0 : sequence.num_new_tokens - 1;
      placed.decoder_row_offset = static_cast<int32_t>(row_token_ids_.size());
      placed.num_decoder_rows = sequence.num_new_tokens - first;
      for (int32_t i = first; i < sequence.num_new_tokens; ++i) {
        const int32_t token = sequence.token_offset + i;
        row_token_ids_.push_back(batch.token_ids[token]);
        row_positions_.push_back(batch.positions[token]);
        row_adapter_slots_.push_back(sequence.decoder_adapter_slot);
        kv_slots_.push_back(-1);
        residual_slots_.push_back(-1);
      }
    }
    sequences_.push_back(placed);
  }
}

void StepPlan::plan_attention(const PlanShape& shape) {
  for (auto& by_variant : items_)
    for (auto& items : by_variant) items.clear();
  combine_items_.clear();
  wide_prefill_items_.clear();
  rebuild_items_.clear();
  forked_wide_items_.clear();
  forked_wide_passes_.clear();
  num_scratch_keys_ = 0;
  num_partials_ = 0;
  const int32_t group = shape.num_heads / shape.num_kv_heads;
  std::vector<TileCandidate> candidates[2][2];  // [forked][AttentionVariant]
  std::vector<TileCandidate> wide;              // non-forked prefills on the wide kernel, kAttentionWideRows rows
  std::vector<int32_t> forked_prefill;          // forked sequences in the prefill variant
  auto add_candidates = [&](std::vector<TileCandidate>& list, int32_t s, int32_t rows_per_tile) {
    const AttentionSequence& sequence = sequences_[s];
    const int32_t total_rows = sequence.num_queries() * group;
    for (int32_t row = 0; row < total_rows; row += rows_per_tile) {
      const int32_t num_rows = std::min(rows_per_tile, total_rows - row);
      // Decoder rows go back to earlier tokens: the tile sees up to its furthest query's keys.
      int32_t last_token = 0;
      for (int32_t q = row / group; q <= (row + num_rows - 1) / group; ++q)
        last_token = std::max(last_token, sequence.query_token(q));
      const int32_t kv_end = sequence.num_computed_tokens + last_token + 1;
      list.push_back({s, row, num_rows, kv_end, (kv_end + kAttentionTileKeys - 1) / kAttentionTileKeys});
    }
  };
  for (int32_t s = 0; s < static_cast<int32_t>(sequences_.size()); ++s) {
    const AttentionSequence& sequence = sequences_[s];
    const int32_t total_rows = sequence.num_queries() * group;
    const AttentionVariant variant = total_rows <= attention_variant_rows(AttentionVariant::kDecode)
                                         ? AttentionVariant::kDecode
                                         : AttentionVariant::kPrefill;
    const bool forked = sequence.forked_slot >= 0;
    if (forked && variant == AttentionVariant::kPrefill) {
      forked_prefill.push_back(s);
      continue;
    }
    // A prefill takes the wide kernel when its own items, never split, fill the GPU: decided by the
    // sequence alone, so that its numbers never depend on what shares its step (the kernels round differently).
    const int64_t num_wide_items = (total_rows + kAttentionWideRows - 1) / kAttentionWideRows;
    if (shape.wide_prefill && !forked && variant == AttentionVariant::kPrefill &&
        num_wide_items * shape.num_kv_heads >= shape.num_sms) {
      add_candidates(wide, s, kAttentionWideRows);
      continue;
    }
    add_candidates(candidates[forked ? 1 : 0][static_cast<int>(variant)], s, attention_variant_rows(variant));
  }
  plan_forked_wide(shape, forked_prefill);
  for (int32_t s : forked_prefill)
    add_candidates(candidates[1][static_cast<int>(AttentionVariant::kPrefill)], s,
                   attention_variant_rows(AttentionVariant::kPrefill));
  std::stable_sort(wide.begin(), wide.end(), [](const TileCandidate& a, const TileCandidate& b) {
    return a.num_key_tiles > b.num_key_tiles;
  });
  for (const TileCandidate& c : wide) wide_prefill_items_.push_back({c.sequence, c.row_begin, 0, c.kv_end, -1, {0, 0, 0}});

  for (int forked = 0; forked < 2; ++forked) {
    for (int v = 0; v < 2; ++v) {
      std::vector<TileCandidate>& list = candidates[forked][v];
      std::vector<AttentionWorkItem>& items = items_[forked][v];
      // Longest first, so that the tail of the grid is made of short items.
      std::stable_sort(list.begin(), list.end(), [](const TileCandidate& a, const TileCandidate& b) {
        return a.num_key_tiles > b.num_key_tiles;
      });
      int64_t total_key_tiles = 0;
      for (const TileCandidate& c : list) total_key_tiles += c.num_key_tiles;
      int32_t tiles_per_chunk = INT32_MAX;
      const int64_t num_ctas = static_cast<int64_t>(list.size()) * shape.num_kv_heads;
      if (v == static_cast<int>(AttentionVariant::kDecode)) {
        // Bandwidth-bound: below ~8 CTAs per SM the last wave leaves SMs idle, so
        // the KV ranges are cut into many short chunks (about 32 CTAs per SM), but
        // no shorter than 4 tiles (each CTA pays a prologue and a partial write;
        // figures: bench/README.md, "The measurements behind the CUDA defaults").
        if (!list.empty() && num_ctas < 8LL * shape.num_sms) {
          const int64_t wanted_items = (32LL * shape.num_sms + shape.num_kv_heads - 1) / shape.num_kv_heads;
          tiles_per_chunk = static_cast<int32_t>(
              std::max<int64_t>(kMinDecodeTilesPerChunk, (total_key_tiles + wanted_items - 1) / wanted_items));
          const int32_t ctas_per_sm = forked == 1 && shape.forked_decode_ctas_per_sm > 0
                                          ? shape.forked_decode_ctas_per_sm
                                          : shape.decode_ctas_per_sm;
          if (ctas_per_sm > 0)
            tiles_per_chunk =
                wave_aware_chunk(list, shape.num_sms * static_cast<int64_t>(ctas_per_sm), shape.num_kv_heads);
        }
      } else if (!list.empty() && num_ctas < 4LL * shape.num_sms) {
        // Prefill tiles carry enough work; they split only when too few to fill the GPU.
        const int64_t wanted_items = (4LL * shape.num_sms + shape.num_kv_heads - 1) / shape.num_kv_heads;
        tiles_per_chunk = static_cast<int32_t>(
            std::max<int64_t>(kMinKeyTilesPerChunk, (total_key_tiles + wanted_items - 1) / wanted_items));
      }
      for (const TileCandidate& c : list) {
        if (c.num_key_tiles <= tiles_per_chunk) {
          items.push_back({c.sequence, c.row_begin, 0, c.kv_end, -1, {0, 0, 0}});
          continue;
        }
        const int32_t num_chunks = (c.num_key_tiles + tiles_per_chunk - 1) / tiles_per_chunk;
        combine_items_.push_back({c.sequence, c.row_begin, c.num_rows, num_partials_, num_chunks, {0, 0, 0}});
        for (int32_t k = 0; k < num_chunks; ++k) {
          const int32_t begin = k * tiles_per_chunk * kAttentionTileKeys;
          const int32_t end = std::min(c.kv_end, (k + 1) * tiles_per_chunk * kAttentionTileKeys);
          items.push_back({c.sequence, c.row_begin, begin, end, num_partials_ + k, {0, 0, 0}});
        }
        num_partials_ += num_chunks;
      }
    }
  }
}

void StepPlan::plan_forked_wide(const PlanShape& shape, std::vector<int32_t>& forked_prefill) {
  if (!shape.wide_prefill || shape.forked_wide_prefill_keys <= 0 || forked_prefill.empty()) return;
  const int32_t group = shape.num_heads / shape.num_kv_heads;
  auto context = [&](int32_t s) { return sequences_[s].num_computed_tokens + sequences_[s].num_new_tokens; };
  auto scratch_keys_of = [&](int32_t s) {
    return (context(s) + shape.block_size - 1) / shape.block_size * int64_t{shape.block_size};
  };
  // Each sequence decides alone, so that its numbers never depend on what shares its step (the two
  // kernels round differently): wide when its rebuilt K/V fit the scratch and its own wide items,
  // never split, fill the GPU.
  std::vector<int32_t> chosen;
  for (int32_t s : forked_prefill) {
    const int64_t num_items = (sequences_[s].num_queries() * group + kAttentionWideRows - 1) / kAttentionWideRows;
    if (scratch_keys_of(s) <= shape.forked_wide_prefill_keys && num_items * shape.num_kv_heads >= shape.num_sms)
      chosen.push_back(s);
  }
  if (chosen.empty()) return;
  // Longest contexts first, in passes that each fit the scratch (a pass rebuilds, then attends).
  std::stable_sort(chosen.begin(), chosen.end(), [&](int32_t a, int32_t b) { return context(a) > context(b); });
  std::vector<TileCandidate> wide;
  auto close_pass = [&] {
    std::stable_sort(wide.begin(), wide.end(), [](const TileCandidate& a, const TileCandidate& b) {
      return a.num_key_tiles > b.num_key_tiles;
    });
    for (const TileCandidate& c : wide) forked_wide_items_.push_back({c.sequence, c.row_begin, 0, c.kv_end, -1, {0, 0, 0}});
    wide.clear();
    forked_wide_passes_.back().rebuild_end = static_cast<int32_t>(rebuild_items_.size());
    forked_wide_passes_.back().item_end = static_cast<int32_t>(forked_wide_items_.size());
  };
  int32_t next_block = 0;
  for (int32_t s : chosen) {
    const int32_t num_keys = context(s);
    const int32_t num_blocks = (num_keys + shape.block_size - 1) / shape.block_size;
    if (forked_wide_passes_.empty() ||
        static_cast<int64_t>(next_block + num_blocks) * shape.block_size > shape.forked_wide_prefill_keys) {
      if (!forked_wide_passes_.empty()) close_pass();
      forked_wide_passes_.push_back({static_cast<int32_t>(rebuild_items_.size()), 0,
                                     static_cast<int32_t>(forked_wide_items_.size()), 0});
      next_block = 0;  // the pass reuses the scratch from its start
    }
    AttentionSequence copy = sequences_[s];
    copy.forked_slot = -1;
    copy.block_table_offset = static_cast<int32_t>(tables_.size());
    for (int32_t b = 0; b < num_blocks; ++b) tables_.push_back(next_block++);
    num_scratch_keys_ = std::max(num_scratch_keys_, next_block * shape.block_size);
    const int32_t scratch_sequence = static_cast<int32_t>(sequences_.size());
    sequences_.push_back(copy);
    for (int32_t key = 0; key < num_keys; key += kAttentionTileKeys)
      rebuild_items_.push_back({s, scratch_sequence, key, std::min(num_keys, key + kAttentionTileKeys)});
    const int32_t total_rows = copy.num_queries() * group;
    for (int32_t row = 0; row < total_rows; row += kAttentionWideRows) {
      const int32_t num_rows = std::min(kAttentionWideRows, total_rows - row);
      int32_t last_token = 0;  // as add_candidates: the tile's furthest query
      for (int32_t q = row / group; q <= (row + num_rows - 1) / group; ++q)
        last_token = std::max(last_token, copy.query_token(q));
      const int32_t kv_end = copy.num_computed_tokens + last_token + 1;
      wide.push_back({scratch_sequence, row, num_rows, kv_end, (kv_end + kAttentionTileKeys - 1) / kAttentionTileKeys});
    }
  }
  close_pass();
  forked_prefill.erase(std::remove_if(forked_prefill.begin(), forked_prefill.end(),
                                      [&](int32_t s) { return std::find(chosen.begin(), chosen.end(), s) != chosen.end(); }),
                       forked_prefill.end());
}

void StepPlan::plan_lora() {
  lora_tokens_.clear();
  lora_tiles_.clear();
  const int32_t num_rows = static_cast<int32_t>(row_adapter_slots_.size());
  lora_row_of_token_.assign(num_rows, -1);
  // Group by slot in order of first appearance; counting sort over the slots present.
  std::vector<int32_t> slots;
  for (int32_t slot : row_adapter_slots_)
    if (slot >= 0 && std::find(slots.begin(), slots.end(), slot) == slots.end()) slots.push_back(slot);
  for (int32_t slot : slots) {
    const int32_t first = static_cast<int32_t>(lora_tokens_.size());
    for (int32_t t = 0; t < num_rows; ++t)
      if (row_adapter_slots_[t] == slot) lora_tokens_.push_back(t);
    const int32_t last = static_cast<int32_t>(lora_tokens_.size());
    for (int32_t row = first; row < last; ++row) lora_row_of_token_[lora_tokens_[row]] = row;
    for (int32_t row = first; row < last; row += kLoraTileRows)
      lora_tiles_.push_back({slot, row, std::min(kLoraTileRows, last - row), 0});
  }
}

void StepPlan::build(const Batch& batch, const PlanShape& shape, int32_t residual_block_size) {
  padded_ = false;
  shape_ = shape;
  place_rows(batch, shape, residual_block_size);
  tables_.assign(batch.block_tables.begin(), batch.block_tables.end());
  tables_.insert(tables_.end(), batch.residual_block_tables.begin(), batch.residual_block_tables.end());
  logit_rows_.clear();
  logit_tokens_.clear();
  sampling_rows_.clear();
  num_device_sampled_rows_ = 0;
  for (size_t s = 0; s < batch.sequences.size(); ++s) {
    const BatchSequence& sequence = batch.sequences[s];
    const AttentionSequence& placed = sequences_[s];
    const int32_t first = sequence.logits_for_all_tokens ? 0 : sequence.num_new_tokens - 1;
    for (int32_t i = first; i < sequence.num_new_tokens; ++i) {
      const int32_t token = sequence.token_offset + i;
      // Base sharing: the logits come from the token's decoder row.
      logit_rows_.push_back(placed.num_decoder_rows > 0 ? placed.decoder_row_offset + (i - first) : token);
      logit_tokens_.push_back(token);
      if (batch.sampling.empty()) continue;
      const DeviceSampling& sampling = batch.sampling[s];
      SamplingRow row;
      if (sampling.on_device) {
        row = {1,
               sampling.temperature,
               sampling.top_k,
               sampling.top_p,
               static_cast<uint32_t>(sampling.seed),
               static_cast<uint32_t>(sampling.seed >> 32),
               static_cast<uint32_t>(sampling.step),
               static_cast<uint32_t>(sampling.step >> 32),
               sampling.mask_row,
               sampling.repetition_penalty,
               sampling.min_p,
               sampling.edits_begin,
               sampling.num_edits};
        ++num_device_sampled_rows_;
      }
      sampling_rows_.push_back(row);
    }
  }
  plan_attention(shape);
  plan_lora();
  launch_logit_rows_ = logit_rows_;
  launch_sampling_rows_ = sampling_rows_;
  assemble_words();
}

void StepPlan::assemble_words() {
  words_.clear();
  append(sections_.token_ids, row_token_ids_);
  append(sections_.positions, row_positions_);
  append(sections_.kv_slots, kv_slots_);
  append(sections_.sequences, sequences_);
  append(sections_.prefill_items, items_[0][0]);
  append(sections_.wide_prefill_items, wide_prefill_items_);
  append(sections_.decode_items, items_[0][1]);
  append(sections_.forked_prefill_items, items_[1][0]);
  append(sections_.forked_decode_items, items_[1][1]);
  append(sections_.combine_items, combine_items_);
  append(sections_.rebuild_items, rebuild_items_);
  append(sections_.forked_wide_items, forked_wide_items_);
  append(sections_.lora_tokens, lora_tokens_);
  append(sections_.lora_tiles, lora_tiles_);
  append(sections_.logit_rows, launch_logit_rows_);
  append(sections_.sampling, launch_sampling_rows_);
  append(sections_.lora_row_of_token, lora_row_of_token_);
  append(sections_.residual_slots, residual_slots_);
  append(sections_.row_adapter_slots, row_adapter_slots_);
  append(sections_.block_tables, tables_);
  sections_.residual_block_tables = sections_.block_tables;
}

LaunchCounts StepPlan::launch_counts() const {
  LaunchCounts counts;
  counts.rows = num_rows();
  counts.sequences = static_cast<int32_t>(sequences_.size());
  counts.prefill_items = num_prefill_items();
  counts.wide_prefill_items = num_wide_prefill_items();
  counts.decode_items = num_decode_items();
  counts.forked_prefill_items = num_forked_prefill_items();
  counts.forked_decode_items = num_forked_decode_items();
  counts.combine_items = num_combine_items();
  counts.rebuild_items = num_rebuild_items();
  counts.forked_wide_items = num_forked_wide_items();
  counts.lora_rows = num_lora_rows();
  counts.lora_tiles = num_lora_tiles();
  counts.logit_rows = num_logit_launch_rows();
  counts.sampling_rows = static_cast<int32_t>(launch_sampling_rows_.size());
  counts.has_forked_sequences = has_forked_sequences();
  counts.has_residual_writes = has_residual_writes_;
  return counts;
}

bool StepPlan::pad_for_graph(int32_t max_rows) {
  if (padded_ || num_rows() == 0 || num_rows() > max_rows || !items_[0][0].empty() || !items_[1][0].empty() ||
      !wide_prefill_items_.empty() || !forked_wide_items_.empty())
    return false;
  padded_ = true;
  const int32_t real_rows = num_rows();
  const int32_t rows = graph_capacity(real_rows);
  row_token_ids_.resize(rows, 0);
  row_positions_.resize(rows, 0);
  row_adapter_slots_.resize(rows, -1);
  kv_slots_.resize(rows, -1);
  residual_slots_.resize(rows, -1);
  lora_row_of_token_.resize(rows, -1);
  sequences_.resize(rows);  // never referenced by a work item
  // Steps with adapters pad to the floors: their mix of modes, adapters and contexts gave nearly every step a
  // shape of its own. Base-model steps keep their own counts (few shapes; no no-op items in the batch-1 step).
  const bool with_adapters = !lora_tokens_.empty() || has_forked_sequences();
  const GraphListFloors floors = with_adapters ? graph_list_floors(rows, shape_) : GraphListFloors{};
  // An empty list stays empty (its kernel is not launched); a non-empty one pads to at least its floor.
  auto capacity = [](size_t n, int32_t floor) {
    return n == 0 ? 0 : graph_capacity(std::max(static_cast<int32_t>(n), floor));
  };
  for (int forked = 0; forked < 2; ++forked)
    for (auto& items : items_[forked]) {
      AttentionWorkItem none;
      none.sequence = -1;
      items.resize(capacity(items.size(), forked ? floors.forked_decode_items : floors.decode_items), none);
    }
  AttentionCombineItem no_combine;
  no_combine.sequence = -1;
  combine_items_.resize(capacity(combine_items_.size(), floors.combine_items), no_combine);
  if (!lora_tokens_.empty()) {
    lora_tokens_.resize(rows, 0);
    lora_tiles_.resize(capacity(lora_tiles_.size(), floors.lora_tiles), LoraTile{0, 0, 0, 0});
  }
  // Padding logits rows take rows that give no logits, each a different one:
  // the final norm adds the last delta into its row in place, and two CTAs on
  // one row would race. There are enough: the capacity is at most the rows'.
  const size_t logit_capacity = std::min(capacity(launch_logit_rows_.size(), floors.logit_rows), rows);
  std::vector<bool> gives_logits(rows, false);
  for (int32_t row : logit_rows_) gives_logits[row] = true;
  for (int32_t k = 0; launch_logit_rows_.size() < logit_capacity; ++k) {
    const int32_t row = (real_rows + k) % rows;  // padding rows first
    if (!gives_logits[row]) launch_logit_rows_.push_back(row);
  }
  if (!launch_sampling_rows_.empty()) launch_sampling_rows_.resize(launch_logit_rows_.size(), SamplingRow{});
  assemble_words();
  return true;
}

}  // namespace loom::cuda
