#include "engine/request_kv.h"

#include <algorithm>

#include "lora/adapter.h"

namespace loom {

RequestKvPlan plan_request_kv(const std::string& adapter_name, const LoraAdapter* adapter, KvSharing sharing,
                              int32_t slot, std::span<const int32_t> prompt, int32_t block_size) {
  RequestKvPlan plan;
  if (adapter_name.empty() || adapter == nullptr) {
    plan.kv.key = KvKey::single(kBaseKvNamespace);
    plan.mode_label = "none";
    return plan;
  }
  plan.mode_label = kv_sharing_name(sharing);
  plan.scheduler_adapter = adapter_name;
  plan.sharing = SequenceSharing{slot, sharing, 0};
  switch (sharing) {
    case KvSharing::kIsolated:
      plan.kv.key = KvKey::single(isolated_kv_namespace(adapter_name));
      break;
    case KvSharing::kActivated: {
      const std::vector<int>& invocation = adapter->config.alora_invocation_tokens;
      const std::optional<int32_t> start = find_alora_invocation_start(
          prompt, std::span<const int32_t>(invocation.data(), invocation.size()));
      if (!start) {  // PEFT: no invocation, the base model answers
        plan.kv.key = KvKey::single(kBaseKvNamespace);
        plan.sharing = SequenceSharing{};
        plan.scheduler_adapter.clear();
        break;
      }
      plan.kv.key = activated_kv_key(adapter_name, *start, block_size);
      plan.sharing.invocation_start = *start;
      break;
    }
    case KvSharing::kBase:
      plan.kv.key = KvKey::single(kBaseKvNamespace);
      break;
    case KvSharing::kForked:
      plan.kv.key = KvKey::single(kForkedBaseKvNamespace);
      plan.kv.residual_namespace = residual_kv_namespace(adapter_name);
      break;
  }
  return plan;
}

}  // namespace loom
