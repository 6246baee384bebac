#include "lora/kv_sharing.h"

#include <algorithm>

#include <fmt/format.h>

#include "lora/adapter.h"
#include "model/config.h"
#include "util/error.h"

namespace loom {
namespace {

constexpr const char* kAllowedNames = "isolated, activated, base, forked";

bool targets_anywhere(const LoraAdapter& adapter, LoraTarget target) {
  for (const auto& layer : adapter.layers)
    if (layer[static_cast<size_t>(target)]) return true;
  return false;
}

}  // namespace

const char* kv_sharing_name(KvSharing sharing) {
  switch (sharing) {
    case KvSharing::kIsolated: return "isolated";
    case KvSharing::kActivated: return "activated";
    case KvSharing::kBase: return "base";
    case KvSharing::kForked: return "forked";
  }
  return "isolated";
}

std::optional<KvSharing> parse_kv_sharing(std::string_view text) {
  for (KvSharing sharing : {KvSharing::kIsolated, KvSharing::kActivated, KvSharing::kBase, KvSharing::kForked})
    if (text == kv_sharing_name(sharing)) return sharing;
  return std::nullopt;
}

KvSharing choose_kv_sharing(const LoraConfig& config, std::optional<KvSharing> requested, KvSharing server_default) {
  if (requested) return *requested;
  if (!config.loom_kv_sharing.empty()) {
    const std::optional<KvSharing> own = parse_kv_sharing(config.loom_kv_sharing);
    if (!own)
      throw Error(ErrorKind::kInvalidArgument,
                  fmt::format("adapter_config.json: loom_kv_sharing '{}' is not a sharing mode", config.loom_kv_sharing),
                  fmt::format("use one of {}", kAllowedNames));
    return *own;
  }
  if (!config.alora_invocation_tokens.empty()) return KvSharing::kActivated;
  if (server_default == KvSharing::kActivated) return KvSharing::kIsolated;
  return server_default;
}

std::string check_kv_sharing(KvSharing sharing, const LoraAdapter& adapter, const ModelConfig& model) {
  switch (sharing) {
    case KvSharing::kIsolated:
      return "";
    case KvSharing::kActivated:
      if (adapter.config.alora_invocation_tokens.empty())
        throw Error(ErrorKind::kInvalidArgument,
                    fmt::format("adapter '{}' ({}) cannot be served activated: its adapter_config.json has no "
                                "alora_invocation_tokens",
                                adapter.name, adapter.path),
                    "serve it isolated, or train it as an aLoRA (PEFT alora_invocation_tokens)");
      return "";
    case KvSharing::kBase: {
      const bool has_k = targets_anywhere(adapter, LoraTarget::kK);
      const bool has_v = targets_anywhere(adapter, LoraTarget::kV);
      if (!has_k && !has_v) return "";
      return fmt::format(
          "adapter '{}' is served in base (ICaRus) KV sharing: its LoRA on {} is ignored (every K/V comes from the "
          "base model); outputs match the adapter only if it was trained that way",
          adapter.name, has_k && has_v ? "k_proj and v_proj" : has_k ? "k_proj" : "v_proj");
    }
    case KvSharing::kForked:
      if (model.qk_norm)
        throw Error(ErrorKind::kUnsupported,
                    fmt::format("adapter '{}' cannot be served forked on this model: RMSNorm on K (q/k norm) does "
                                "not commute with ForkKV's residual split of K",
                                adapter.name),
                    "serve it isolated, activated or base");
      return "";
  }
  return "";
}

std::optional<int32_t> find_alora_invocation_start(std::span<const int32_t> prompt,
                                                   std::span<const int32_t> invocation_tokens) {
  if (invocation_tokens.empty() || invocation_tokens.size() > prompt.size()) return std::nullopt;
  for (size_t start = prompt.size() - invocation_tokens.size() + 1; start-- > 0;)
    if (std::equal(invocation_tokens.begin(), invocation_tokens.end(), prompt.begin() + static_cast<ptrdiff_t>(start)))
      return static_cast<int32_t>(start);
  return std::nullopt;
}

}  // namespace loom
