#include "backend/cpu/lora_apply.h"

#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_kernels.h"

namespace loom::cpu {

void LoraApplier::group_tokens(const std::vector<int32_t>& adapter_slots, int32_t max_adapter_slots) {
  group_of_slot_.assign(max_adapter_slots, -1);
  for (int32_t g = 0; g < num_groups_; ++g) groups_[g].tokens.clear();
  num_groups_ = 0;
  for (size_t token = 0; token < adapter_slots.size(); ++token) {
    const int32_t slot = adapter_slots[token];
    if (slot < 0) continue;
    int32_t& group_index = group_of_slot_[slot];
    if (group_index < 0) {
      group_index = num_groups_++;
      if (groups_.size() < static_cast<size_t>(num_groups_)) groups_.emplace_back();
      groups_[group_index].slot = slot;
      groups_[group_index].tokens.clear();
    }
    groups_[group_index].tokens.push_back(static_cast<int32_t>(token));
  }
  for (int32_t g = 0; g < num_groups_; ++g) {
    AdapterTokenGroup& group = groups_[g];
    group.is_contiguous =
        group.tokens.back() - group.tokens.front() + 1 == static_cast<int32_t>(group.tokens.size());
  }
}

void LoraApplier::apply(LoraTarget target, int layer, const float* x, int64_t in_features, float* y,
                        int64_t out_features,
                        const std::vector<std::shared_ptr<const LoraAdapter>>& adapters) {
  for (int32_t g = 0; g < num_groups_; ++g) {
    const AdapterTokenGroup& group = groups_[g];
    const auto& module = adapters[group.slot]->layers[layer][static_cast<int>(target)];
    if (!module.has_value()) continue;
    const int64_t num_rows = static_cast<int64_t>(group.tokens.size());
    const int64_t rank = module->rank;
    low_rank_.resize(static_cast<size_t>(num_rows * rank));

    if (group.is_contiguous) {
      const int64_t first = group.tokens.front();
      linear(x + first * in_features, num_rows, in_features, module->a.data, nullptr, rank,
             low_rank_.data());
      linear_accumulate(low_rank_.data(), rank, num_rows, rank, module->b.data, out_features,
                        module->scale, y + first * out_features, out_features);
      continue;
    }

    gathered_input_.resize(static_cast<size_t>(num_rows * in_features));
    for (int64_t r = 0; r < num_rows; ++r)
      std::memcpy(gathered_input_.data() + r * in_features, x + group.tokens[r] * in_features,
                  static_cast<size_t>(in_features) * sizeof(float));
    linear(gathered_input_.data(), num_rows, in_features, module->a.data, nullptr, rank,
           low_rank_.data());
    delta_.assign(static_cast<size_t>(num_rows * out_features), 0.0f);
    linear_accumulate(low_rank_.data(), rank, num_rows, rank, module->b.data, out_features,
                      module->scale, delta_.data(), out_features);
    for (int64_t r = 0; r < num_rows; ++r) {
      float* y_row = y + group.tokens[r] * out_features;
      const float* delta_row = delta_.data() + r * out_features;
#pragma omp simd
      for (int64_t i = 0; i < out_features; ++i) y_row[i] += delta_row[i];
    }
  }
}

}  // namespace loom::cpu
