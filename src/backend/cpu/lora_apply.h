// Multi-LoRA on the CPU: every token carries its own adapter slot, so each
// targeted module's output gets, per group of tokens sharing a slot,
//   Y[group rows] += scale * (X[group rows] A^T) B^T
// with two sgemms per group. Groups need not be contiguous in the batch; rows
// of a non-contiguous group are gathered first and scattered back after.
//
// Thread: one LoraApplier per backend, used from the engine thread only. It
// keeps its scratch buffers between calls to avoid per-step allocations.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "lora/adapter.h"

namespace loom::cpu {

struct AdapterTokenGroup {
  int32_t slot = -1;
  std::vector<int32_t> tokens;  // batch token indices, ascending
  bool is_contiguous = true;    // tokens == [tokens.front(), tokens.front() + size)
};

class LoraApplier {
 public:
  // Groups the batch's tokens by adapter slot (slot -1, the base model, gets no group).
  // Slots must already be validated (in range, bound).
  void group_tokens(const std::vector<int32_t>& adapter_slots, int32_t max_adapter_slots);

  bool has_groups() const { return num_groups_ > 0; }

  // Adds the LoRA delta of `target` in `layer` to y[num_tokens, out_features],
  // given the module input x[num_tokens, in_features]. `adapters[slot]` is the
  // adapter bound to each slot. Tokens whose adapter does not target the module
  // are left alone.
  void apply(LoraTarget target, int layer, const float* x, int64_t in_features, float* y,
             int64_t out_features,
             const std::vector<std::shared_ptr<const LoraAdapter>>& adapters);

 private:
  std::vector<AdapterTokenGroup> groups_;  // first num_groups_ in use; capacity kept
  int32_t num_groups_ = 0;
  std::vector<int32_t> group_of_slot_;
  std::vector<float> gathered_input_;
  std::vector<float> low_rank_;
  std::vector<float> delta_;
};

}  // namespace loom::cpu
