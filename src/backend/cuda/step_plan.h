// The host side of one forward step: everything the kernels need to know about
// the batch (token ids, positions, KV write slots, block tables, attention work
// items, LoRA row groups, logits rows), packed into one array of int32 words so
// that it is uploaded with a single copy.
//
// Attention work (plan_types.h): a sequence whose rows (new tokens x group
// heads) fit in 16 takes the decode kernel, others the prefill kernel in tiles
// of 64 rows. When the tiles alone would leave the GPU idle (few sequences,
// long contexts), each tile's KV range is split into chunks that run in
// parallel (split-KV / flash-decoding) and a combine item merges them.
// Pure host code (no CUDA calls): unit-testable without a GPU.
#pragma once

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
  // unknown, split into chunks of the minimum length.
  int32_t decode_ctas_per_sm = 0;
};

struct PlanSections {  // offsets in int32 words into StepPlan::words()
  size_t token_ids = 0, positions = 0, kv_slots = 0, block_tables = 0, sequences = 0, prefill_items = 0,
         decode_items = 0, combine_items = 0, lora_tokens = 0, lora_tiles = 0, logit_rows = 0, sampling = 0,
         lora_row_of_token = 0;
};

// Throws Error(kInvalidArgument) unless batch.sampling is empty or one valid
// DeviceSampling per sequence (temperature >= 0 and finite, top_k >= 0, top_p
// in (0, 1], no logits_for_all_tokens on a sequence sampled on the device).
void check_device_sampling(const Batch& batch);

class StepPlan {
 public:
  // Rebuilds the plan for `batch`, which must already be validated (block
  // tables cover every sequence, slots in range). Reuses capacity.
  void build(const Batch& batch, const PlanShape& shape);

  const std::vector<int32_t>& words() const { return words_; }
  const PlanSections& sections() const { return sections_; }

  int32_t num_tokens() const { return num_tokens_; }
  int32_t num_prefill_items() const { return static_cast<int32_t>(prefill_items_.size()); }
  int32_t num_decode_items() const { return static_cast<int32_t>(decode_items_.size()); }
  int32_t num_combine_items() const { return static_cast<int32_t>(combine_items_.size()); }
  int32_t num_partials() const { return num_partials_; }
  int32_t num_lora_rows() const { return static_cast<int32_t>(lora_tokens_.size()); }
  int32_t num_lora_tiles() const { return static_cast<int32_t>(lora_tiles_.size()); }
  const std::vector<int32_t>& logit_rows() const { return logit_rows_; }
  // Device sampling: one SamplingRow per logits row when the batch has
  // Batch::sampling, else empty; num_device_sampled_rows() of them on_device.
  const std::vector<SamplingRow>& sampling_rows() const { return sampling_rows_; }
  int32_t num_device_sampled_rows() const { return num_device_sampled_rows_; }
  // Host copies of the work lists (for tests and benchmarks).
  const std::vector<AttentionWorkItem>& prefill_items() const { return prefill_items_; }
  const std::vector<AttentionWorkItem>& decode_items() const { return decode_items_; }

 private:
  void plan_attention(const Batch& batch, const PlanShape& shape);
  void plan_lora(const Batch& batch);
  template <typename T>
  void append(size_t& offset, const std::vector<T>& values);

  int32_t num_tokens_ = 0;
  int32_t num_partials_ = 0;
  std::vector<int32_t> kv_slots_;
  std::vector<AttentionSequence> sequences_;
  std::vector<AttentionWorkItem> prefill_items_, decode_items_;
  std::vector<AttentionCombineItem> combine_items_;
  std::vector<int32_t> lora_tokens_;
  std::vector<int32_t> lora_row_of_token_;  // [num_tokens]: index into lora_tokens_, -1 without adapter
  std::vector<LoraTile> lora_tiles_;
  std::vector<int32_t> logit_rows_;
  std::vector<SamplingRow> sampling_rows_;
  int32_t num_device_sampled_rows_ = 0;
  std::vector<int32_t> words_;
  PlanSections sections_;
};

}  // namespace loom::cuda
