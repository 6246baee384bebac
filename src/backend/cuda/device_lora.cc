#include "backend/cuda/device_lora.h"

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "util/half.h"

namespace loom::cuda {

static_assert(kNumLoraTargets == kLoraTargets, "the kernels index the module table with kLoraTargets targets");
static_assert(static_cast<int>(LoraTarget::kK) == kLoraTargetK && static_cast<int>(LoraTarget::kV) == kLoraTargetV,
              "the rCache kernels name the k and v modules by index");

DeviceLoraTable::DeviceLoraTable(int32_t num_slots, const ModelConfig& config)
    : config_(config), num_slots_(num_slots) {
  storage_.resize(num_slots);
  slot_max_rank_.assign(num_slots, 0);
  host_table_.assign(static_cast<size_t>(std::max(num_slots, 1)) * config.num_layers * kNumLoraTargets, LoraModuleRef{});
  table_.allocate(host_table_.size() * sizeof(LoraModuleRef));
  LOOM_CUDA_CHECK(cudaMemcpy(table_.data(), host_table_.data(), host_table_.size() * sizeof(LoraModuleRef),
                             cudaMemcpyHostToDevice));
}

void DeviceLoraTable::set(int32_t slot, const LoraAdapter* adapter, cudaStream_t stream) {
  const size_t entries_per_slot = static_cast<size_t>(config_.num_layers) * kNumLoraTargets;
  LoraModuleRef* entries = host_table_.data() + slot * entries_per_slot;
  std::fill(entries, entries + entries_per_slot, LoraModuleRef{});
  slot_max_rank_[slot] = 0;
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));  // nothing in flight may still read the old weights
  storage_[slot].release();

  if (adapter != nullptr) {
    // Host copy in bf16: for each module A then B, each 8-element aligned (16-byte loads).
    std::vector<uint16_t> host;
    std::vector<std::pair<size_t, size_t>> offsets(entries_per_slot, {0, 0});
    for (int layer = 0; layer < config_.num_layers; ++layer) {
      for (int target = 0; target < kNumLoraTargets; ++target) {
        const auto& module = adapter->layers[layer][target];
        if (!module.has_value()) continue;
        auto append = [&](const Tensor& tensor) {
          const size_t offset = host.size();
          for (int64_t i = 0; i < tensor.numel(); ++i) host.push_back(float_to_bf16(tensor.data[i]));
          host.resize((host.size() + 7) / 8 * 8, 0);
          return offset;
        };
        const size_t a_offset = append(module->a);
        const size_t b_offset = append(module->b);
        offsets[layer * kNumLoraTargets + target] = {a_offset, b_offset};
      }
    }
    storage_[slot].allocate(std::max<size_t>(host.size(), 8) * sizeof(uint16_t));
    if (!host.empty())
      LOOM_CUDA_CHECK(cudaMemcpy(storage_[slot].data(), host.data(), host.size() * sizeof(uint16_t),
                                 cudaMemcpyHostToDevice));
    const auto* base = storage_[slot].as<const __nv_bfloat16>();
    for (int layer = 0; layer < config_.num_layers; ++layer) {
      for (int target = 0; target < kNumLoraTargets; ++target) {
        const auto& module = adapter->layers[layer][target];
        if (!module.has_value()) continue;
        LoraModuleRef& entry = entries[layer * kNumLoraTargets + target];
        entry.a = base + offsets[layer * kNumLoraTargets + target].first;
        entry.b = base + offsets[layer * kNumLoraTargets + target].second;
        entry.rank = module->rank;
        entry.scale = module->scale;
        slot_max_rank_[slot] = std::max(slot_max_rank_[slot], module->rank);
      }
    }
  }
  LOOM_CUDA_CHECK(cudaMemcpy(table_.as<LoraModuleRef>() + slot * entries_per_slot, entries,
                             entries_per_slot * sizeof(LoraModuleRef), cudaMemcpyHostToDevice));
}

int32_t DeviceLoraTable::max_rank() const {
  int32_t rank = 0;
  for (int32_t r : slot_max_rank_) rank = std::max(rank, r);
  return rank;
}

}  // namespace loom::cuda
