#include "engine/backend_support.h"

#include <algorithm>

#include <fmt/format.h>

#include "lora/adapter.h"
#include "model/config.h"
#include "util/error.h"

namespace loom {
namespace {

bool contains(const std::vector<KvSharing>& modes, KvSharing mode) {
  return std::find(modes.begin(), modes.end(), mode) != modes.end();
}

// "isolated or activated"
std::string alternatives_text(const std::vector<KvSharing>& modes) {
  std::string text;
  for (size_t i = 0; i < modes.size(); ++i) {
    if (i > 0) text += i + 1 == modes.size() ? " or " : ", ";
    text += kv_sharing_name(modes[i]);
  }
  return text;
}

}  // namespace

std::vector<KvSharing> allowed_kv_sharing(const BackendCapabilities& capabilities,
                                          const std::vector<KvSharing>& disabled) {
  std::vector<KvSharing> allowed;
  for (KvSharing mode : all_kv_sharing_modes())
    if (capabilities.supports(mode) && !contains(disabled, mode)) allowed.push_back(mode);
  return allowed;
}

void check_kv_sharing_allowed(const BackendCapabilities& capabilities, const std::vector<KvSharing>& disabled,
                              KvSharing mode, const std::string& subject, const std::string& hint) {
  if (!capabilities.supports(mode))
    throw Error(ErrorKind::kUnsupported,
                fmt::format("{}: kv_sharing '{}' is not supported by the {} backend (supported: {})", subject,
                            kv_sharing_name(mode), capabilities.name, kv_sharing_list(capabilities.kv_sharing_modes)),
                hint);
  if (contains(disabled, mode))
    throw Error(ErrorKind::kUnsupported,
                fmt::format("{}: kv_sharing '{}' is disabled on this server by --disable-kv-sharing (allowed: {})",
                            subject, kv_sharing_name(mode), kv_sharing_list(allowed_kv_sharing(capabilities, disabled))),
                hint);
}

void check_engine_supported(const BackendCapabilities& capabilities, const EngineConfig& config,
                            const ModelConfig& model) {
  check_model_capabilities(capabilities, model);
  const std::vector<KvSharing> allowed = allowed_kv_sharing(capabilities, config.disabled_kv_sharing);
  check_kv_sharing_allowed(capabilities, config.disabled_kv_sharing, config.default_sharing, "--default-sharing",
                           allowed.empty() ? "allow a mode (drop it from --disable-kv-sharing)"
                                           : "set --default-sharing to " + alternatives_text(allowed));
  if ((config.host_kv_cache_bytes > 0 || config.num_host_kv_blocks > 0) && !capabilities.host_kv_tier)
    throw Error(ErrorKind::kUnsupported,
                fmt::format("a host KV tier (--host-kv-memory) is not supported by the {} backend", capabilities.name),
                "run without --host-kv-memory");
  if ((config.host_residual_kv_cache_bytes > 0 || config.num_host_residual_kv_blocks > 0) &&
      !capabilities.residual_host_kv_tier)
    throw Error(ErrorKind::kUnsupported,
                fmt::format("a host tier for the forked rCache (--host-residual-kv-memory) is not supported by the {} "
                            "backend",
                            capabilities.name),
                "run with --host-residual-kv-memory auto or 0");
  if (config.kv_cache_dtype == KvCacheDtype::kFp8E4M3 && !capabilities.fp8_kv_cache)
    throw Error(ErrorKind::kUnsupported,
                fmt::format("an FP8 KV cache (--kv-cache-dtype fp8) is not supported by the {} backend",
                            capabilities.name),
                "run with --kv-cache-dtype auto (the backend's own dtype)");
  if (config.fp8_weights && !capabilities.fp8_weights)
    throw Error(ErrorKind::kUnsupported,
                fmt::format("FP8 weights (--quantization fp8) are not supported by the {} backend", capabilities.name),
                "run without --quantization");
  if (config.residual_kv_cache_bytes > 0)
    check_kv_sharing_allowed(capabilities, config.disabled_kv_sharing, KvSharing::kForked,
                             "--residual-kv-cache-memory (the forked adapters' rCache pool)",
                             "run without --residual-kv-cache-memory");
}

void check_adapter_supported(const BackendCapabilities& capabilities, const std::vector<KvSharing>& disabled,
                             const LoraAdapter& adapter, KvSharing mode) {
  const std::string subject = fmt::format("adapter '{}'", adapter.name);
  if (!capabilities.supports(mode) || contains(disabled, mode)) {
    // What it could be loaded as instead (activated only for an aLoRA).
    std::vector<KvSharing> alternatives;
    for (KvSharing other : allowed_kv_sharing(capabilities, disabled))
      if (other != KvSharing::kActivated || !adapter.config.alora_invocation_tokens.empty())
        alternatives.push_back(other);
    std::string hint =
        alternatives.empty()
            ? std::string("no kv_sharing mode this server allows fits this adapter")
            : fmt::format("load it with kv_sharing {} (--lora {}=PATH:{}, or \"kv_sharing\": \"{}\" in the load body)",
                          alternatives_text(alternatives), adapter.name, kv_sharing_name(alternatives.front()),
                          kv_sharing_name(alternatives.front()));
    if (!capabilities.supports(mode))
      hint += fmt::format("; or serve it on a backend that runs {} sharing (--device cpu)", kv_sharing_name(mode));
    check_kv_sharing_allowed(capabilities, disabled, mode, subject, hint);
  }
  if (mode == KvSharing::kForked && capabilities.max_residual_rank > 0) {
    const int32_t kv_rank = adapter.max_kv_rank();
    if (kv_rank > capabilities.max_residual_rank)
      throw Error(ErrorKind::kUnsupported,
                  fmt::format("{}: forked sharing with k/v LoRA rank {}; the {} backend's ResidualAttention runs up to {}",
                              subject, kv_rank, capabilities.name, capabilities.max_residual_rank),
                  fmt::format("load it with kv_sharing isolated or base, or use an adapter of k/v rank <= {}",
                              capabilities.max_residual_rank));
  }
  const int32_t rank = adapter.max_rank();
  if (capabilities.max_lora_rank > 0 && rank > capabilities.max_lora_rank)
    throw Error(ErrorKind::kUnsupported,
                fmt::format("{}: LoRA rank {} is above the {} backend's largest, {}", subject, rank, capabilities.name,
                            capabilities.max_lora_rank),
                fmt::format("use an adapter of rank <= {}, or serve it with --device cpu", capabilities.max_lora_rank));
}

}  // namespace loom
