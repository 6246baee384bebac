// The host side of one forward step: everything the kernels need to know about
// the batch (token ids, positions, KV write slots, block tables, attention work
// items, LoRA row groups, logits rows), packed into one array of int32 words so
// that it is uploaded with a single copy.
//
// Attention work (plan_types.h): a sequence whose rows (new tokens x group
// heads) fit in 16 takes the decode kernel, others the prefill kernel in tiles
// of 64 rows; forked sequences get lists of their own (the ResidualAttention
// kernels). When the tiles alone would leave the GPU idle (few sequences,
// long contexts), each tile's KV range is split into chunks that run in
// parallel (split-KV / flash-decoding) and a combine item merges them.
// Pure host code (no CUDA calls): unit-testable without a GPU.
#pragma once

#include <compare>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/plan_types.h"

namespace loom::cuda {

struct PlanShape {
  int32_t block_size = 16;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t num_sms = 132;  // the GPU's multiprocessors: how much parallel work is enough
  // Decode attention CTAs resident per SM (attention_decode_ctas_per_sm); 0:
  // unknown, split into chunks of the minimum length. The forked list's
  // (ResidualAttention) in forked_decode_ctas_per_sm (0: decode_ctas_per_sm's).
  int32_t decode_ctas_per_sm = 0;
  int32_t forked_decode_ctas_per_sm = 0;
  // The wide (wgmma) prefill kernel serves this head size: non-forked prefill
  // lists with enough work to fill the GPU unsplit run as kPrefillWide items.
  bool wide_prefill = false;
  // Forked prefills run on the wide kernel too (over keys and values rebuilt
  // into a scratch pool, plan_types.h ResidualRebuildItem) when their lists
  // fill the GPU the same way and their contexts fit this many scratch KV
  // entries together; 0: they stay on the ResidualAttention kernel.
  int32_t forked_wide_prefill_keys = 0;
};

// Offsets in int32 words into StepPlan::words(). The rCache block tables follow
// the main ones in one section (residual_block_tables == block_tables), and a
// sequence's residual_block_table_offset counts from its start.
struct PlanSections {
  size_t token_ids = 0, positions = 0, kv_slots = 0, block_tables = 0, residual_block_tables = 0, sequences = 0,
         prefill_items = 0, decode_items = 0, forked_prefill_items = 0, forked_decode_items = 0, combine_items = 0,
         lora_tokens = 0, lora_tiles = 0, logit_rows = 0, sampling = 0, lora_row_of_token = 0, residual_slots = 0,
         row_adapter_slots = 0, rebuild_items = 0, forked_wide_items = 0, wide_prefill_items = 0;
};

// How many of each list the step's kernels are launched over: the plan's own
// counts, or after StepPlan::pad_for_graph its padded capacities. Together with
// the backend's own switches they decide every launch of a step, so a CUDA
// graph captured for one LaunchCounts replays any step planned to the same.
struct LaunchCounts {
  int32_t rows = 0, sequences = 0, prefill_items = 0, decode_items = 0, forked_prefill_items = 0,
          forked_decode_items = 0, combine_items = 0, lora_rows = 0, lora_tiles = 0, logit_rows = 0,
          sampling_rows = 0, rebuild_items = 0, forked_wide_items = 0, wide_prefill_items = 0;
  bool has_forked_sequences = false, has_residual_writes = false;
  auto operator<=>(const LaunchCounts&) const = default;
};

// The padded size of a list of n entries in a graph-captured step: n up to 4
// rounded up to a power of two, then two sizes per doubling (6, 8, 12, 16, 24,
// ...), so a step's lists grow into a few captured shapes.
int32_t graph_capacity(int32_t n);

// pad_for_graph's floors for a step of `rows` padded rows.
struct GraphListFloors {
  int32_t decode_items = 0, forked_decode_items = 0, combine_items = 0, lora_tiles = 0, logit_rows = 0;
};
GraphListFloors graph_list_floors(int32_t rows, const PlanShape& shape);

// Throws Error(kInvalidArgument) unless batch.sampling is empty or one valid
// DeviceSampling per sequence (temperature >= 0 and finite, top_k >= 0, top_p
// in (0, 1], no logits_for_all_tokens on a sequence sampled on the device, a
// mask_row below num_token_mask_rows).
void check_device_sampling(const Batch& batch);

// Rows. The step's activations have one row per batch token, then one
// decoder row per logits token of each base-sharing (ICaRus) sequence, a
// sequence's decoder rows consecutive (as the CPU backend's TokenPlacement):
//   rows: | token 0 ... token n-1 | decoder rows n ... n + d - 1 |
// A decoder row has its token's id and position, the sequence's decoder
// adapter, writes no K/V and gives the sequence's logits. Every per-row section
// (token_ids, positions, kv_slots, lora_row_of_token, residual_slots,
// row_adapter_slots) has num_rows() entries.
class StepPlan {
 public:
  // Rebuilds the plan for `batch`, which must already be validated (block
  // tables cover every sequence, slots in range). `residual_block_size` is the
  // rCache's (read only when the batch has forked sequences). Reuses capacity.
  void build(const Batch& batch, const PlanShape& shape, int32_t residual_block_size = 0);

  // Pads the plan of a step without prefill tiles and with at most max_rows
  // rows to graph_capacity of each list, so that launch_counts() and every
  // section's offset depend only on those capacities. In steps with adapters
  // (LoRA rows or forked sequences), lists whose length follows the contexts
  // or the adapters rather than the rows start from a floor set by the row
  // capacity (graph_list_floors), so such decode steps of one row capacity
  // share one launch shape whatever their contexts and adapters:
  // the logits rows pad to the row capacity, the combine items too, non-empty
  // decode item lists to one wave of split-KV items, LoRA tiles to one tile
  // per kLoraTileRows rows plus one per possible adapter group. Padding rows have token 0,
  // position 0, write no K/V or rCache entry and carry no adapter; padding work
  // items and combine items have sequence -1, LoRA tiles zero rows, padding
  // logits rows are distinct rows that give no logits (sampled on the host
  // side: token -1). logit_rows() and
  // sampling_rows() stay the batch's own. Returns false (plan unchanged) for a
  // step that does not qualify.
  bool pad_for_graph(int32_t max_rows);
  bool is_padded() const { return padded_; }
  LaunchCounts launch_counts() const;

  const std::vector<int32_t>& words() const { return words_; }
  const PlanSections& sections() const { return sections_; }

  int32_t num_tokens() const { return num_tokens_; }
  int32_t num_rows() const { return static_cast<int32_t>(row_token_ids_.size()); }
  // Prefill items on the kPrefill kernel, and on the wide one (kPrefillWide or its
  // ping-pong form: 128-row items, none split) for the sequences whose own
  // items fill the GPU.
  int32_t num_prefill_items() const { return static_cast<int32_t>(items_[0][0].size()); }
  int32_t num_wide_prefill_items() const { return static_cast<int32_t>(wide_prefill_items_.size()); }
  int32_t num_decode_items() const { return static_cast<int32_t>(items_[0][1].size()); }
  int32_t num_forked_prefill_items() const { return static_cast<int32_t>(items_[1][0].size()); }
  int32_t num_forked_decode_items() const { return static_cast<int32_t>(items_[1][1].size()); }
  int32_t num_combine_items() const { return static_cast<int32_t>(combine_items_.size()); }
  // Forked prefills on the wide kernel: the rebuild items, the kPrefillWide
  // items over the scratch copies, and the scratch KV entries they need (a
  // multiple of the block size). The items run in passes that each fit the
  // scratch: rebuild_items [rebuild_begin, rebuild_end), then the wide items
  // [item_begin, item_end), each pass overwriting the scratch.
  const std::vector<ForkedWidePass>& forked_wide_passes() const { return forked_wide_passes_; }
  int32_t num_rebuild_items() const { return static_cast<int32_t>(rebuild_items_.size()); }
  int32_t num_forked_wide_items() const { return static_cast<int32_t>(forked_wide_items_.size()); }
  int32_t num_scratch_keys() const { return num_scratch_keys_; }
  int32_t num_partials() const { return num_partials_; }
  int32_t num_lora_rows() const { return static_cast<int32_t>(lora_tokens_.size()); }
  int32_t num_lora_tiles() const { return static_cast<int32_t>(lora_tiles_.size()); }
  // Forked sequences: whether any, whether any token writes an rCache entry,
  // and the longest forked context (RoPE positions the residual keys need).
  bool has_forked_sequences() const { return max_forked_context_ > 0; }
  bool has_residual_writes() const { return has_residual_writes_; }
  int32_t max_forked_context() const { return max_forked_context_; }
  // Rows the logits kernels run over: logit_rows().size(), padded after pad_for_graph.
  int32_t num_logit_launch_rows() const { return static_cast<int32_t>(launch_logit_rows_.size()); }
  // Activation rows that give logits, and the batch token each belongs to
  // (ForwardResult::logit_token_index; a decoder row's is its token).
  const std::vector<int32_t>& logit_rows() const { return logit_rows_; }
  const std::vector<int32_t>& logit_tokens() const { return logit_tokens_; }
  // Device sampling: one SamplingRow per logits row when the batch has
  // Batch::sampling, else empty; num_device_sampled_rows() of them on_device.
  const std::vector<SamplingRow>& sampling_rows() const { return sampling_rows_; }
  int32_t num_device_sampled_rows() const { return num_device_sampled_rows_; }
  // Host copies of the work lists (for tests and benchmarks).
  const std::vector<AttentionWorkItem>& prefill_items() const { return items_[0][0]; }
  const std::vector<AttentionWorkItem>& wide_prefill_items() const { return wide_prefill_items_; }
  const std::vector<AttentionWorkItem>& decode_items() const { return items_[0][1]; }
  const std::vector<AttentionWorkItem>& forked_prefill_items() const { return items_[1][0]; }
  const std::vector<AttentionWorkItem>& forked_decode_items() const { return items_[1][1]; }
  const std::vector<AttentionWorkItem>& forked_wide_items() const { return forked_wide_items_; }
  const std::vector<ResidualRebuildItem>& rebuild_items() const { return rebuild_items_; }
  const std::vector<AttentionSequence>& sequences() const { return sequences_; }

 private:
  void place_rows(const Batch& batch, const PlanShape& shape, int32_t residual_block_size);
  void plan_attention(const PlanShape& shape);
  // Moves the forked prefills that qualify (PlanShape::forked_wide_prefill_keys;
  // each sequence alone, whatever shares the step) out of `forked_prefill`
  // into scratch copies, rebuild items and wide items, in passes.
  void plan_forked_wide(const PlanShape& shape, std::vector<int32_t>& forked_prefill);
  void plan_lora();
  // words_ from the members: fixed-size sections first, the block tables (main,
  // then rCache) last, so a padded plan's offsets depend on its capacities only.
  void assemble_words();
  template <typename T>
  void append(size_t& offset, const std::vector<T>& values);

  PlanShape shape_;  // build()'s
  int32_t num_tokens_ = 0;
  int32_t num_partials_ = 0;
  std::vector<AttentionWorkItem> wide_prefill_items_;
  int32_t max_forked_context_ = 0;
  bool has_residual_writes_ = false;
  std::vector<int32_t> row_token_ids_, row_positions_, row_adapter_slots_;
  std::vector<int32_t> kv_slots_;        // [rows], -1: write no K/V
  std::vector<int32_t> residual_slots_;  // [rows], rCache slot to write; -2 forked, nothing to write; -1 not forked
  std::vector<AttentionSequence> sequences_;
  std::vector<AttentionWorkItem> items_[2][2];  // [forked][AttentionVariant]
  std::vector<AttentionCombineItem> combine_items_;
  std::vector<ResidualRebuildItem> rebuild_items_;
  std::vector<AttentionWorkItem> forked_wide_items_;
  std::vector<ForkedWidePass> forked_wide_passes_;
  int32_t num_scratch_keys_ = 0;
  std::vector<int32_t> lora_tokens_;
  std::vector<int32_t> lora_row_of_token_;  // [rows]: index into lora_tokens_, -1 without adapter
  std::vector<LoraTile> lora_tiles_;
  std::vector<int32_t> logit_rows_, logit_tokens_;
  std::vector<SamplingRow> sampling_rows_;
  std::vector<int32_t> launch_logit_rows_;        // logit_rows_, padded by pad_for_graph
  std::vector<SamplingRow> launch_sampling_rows_;  // sampling_rows_, padded likewise
  std::vector<int32_t> tables_;  // the batch's block tables, then its rCache tables
  bool padded_ = false;
  int32_t num_device_sampled_rows_ = 0;
  std::vector<int32_t> words_;
  PlanSections sections_;
};

}  // namespace loom::cuda
