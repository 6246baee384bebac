#include "lora/adapter_shard.h"

namespace loom {

std::shared_ptr<const LoraAdapter> shard_lora_adapter(const LoraAdapter& adapter, const ModelConfig& config,
                                                      const TensorParallelShard& shard) {
  const int64_t head_dim = config.head_dim;
  const int64_t q_begin = shard.q_head_begin * head_dim, q_end = q_begin + shard.num_q_heads * head_dim;
  const int64_t kv_begin = shard.kv_head_begin * head_dim, kv_end = kv_begin + shard.num_kv_heads * head_dim;
  const int64_t ff_begin = shard.intermediate_begin, ff_end = ff_begin + shard.intermediate_size;
  auto part = std::make_shared<LoraAdapter>();
  part->name = adapter.name;
  part->path = adapter.path;
  part->config = adapter.config;
  part->layers.resize(adapter.layers.size());
  for (size_t layer = 0; layer < adapter.layers.size(); ++layer)
    for (int target = 0; target < kNumLoraTargets; ++target) {
      const auto& module = adapter.layers[layer][target];
      if (!module) continue;
      LoraModuleWeights sliced = *module;
      switch (static_cast<LoraTarget>(target)) {
        case LoraTarget::kQ: sliced.b = slice_rows(module->b, q_begin, q_end); break;
        case LoraTarget::kK:
        case LoraTarget::kV: sliced.b = slice_rows(module->b, kv_begin, kv_end); break;
        case LoraTarget::kGate:
        case LoraTarget::kUp: sliced.b = slice_rows(module->b, ff_begin, ff_end); break;
        case LoraTarget::kO: sliced.a = slice_columns(module->a, q_begin, q_end); break;
        case LoraTarget::kDown: sliced.a = slice_columns(module->a, ff_begin, ff_end); break;
      }
      part->layers[layer][target] = std::move(sliced);
    }
  return part;
}

}  // namespace loom
