#include "backend/backend_capabilities.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "model/config.h"
#include "util/error.h"

namespace loom {

bool BackendCapabilities::supports(KvSharing mode) const {
  return std::find(kv_sharing_modes.begin(), kv_sharing_modes.end(), mode) != kv_sharing_modes.end();
}

bool BackendCapabilities::supports_head_dim(int32_t head_dim) const {
  return head_dims.empty() || std::find(head_dims.begin(), head_dims.end(), head_dim) != head_dims.end();
}

const char* kv_cache_dtype_name(KvCacheDtype dtype) {
  return dtype == KvCacheDtype::kFp8E4M3 ? "fp8_e4m3" : "auto";
}

std::vector<KvSharing> all_kv_sharing_modes() {
  return {KvSharing::kIsolated, KvSharing::kActivated, KvSharing::kBase, KvSharing::kForked};
}

std::string kv_sharing_list(const std::vector<KvSharing>& modes) {
  std::string list;
  for (KvSharing mode : all_kv_sharing_modes()) {
    if (std::find(modes.begin(), modes.end(), mode) == modes.end()) continue;
    if (!list.empty()) list += ", ";
    list += kv_sharing_name(mode);
  }
  return list.empty() ? "none" : list;
}

void check_model_capabilities(const BackendCapabilities& capabilities, const ModelConfig& model) {
  if (!capabilities.supports_head_dim(model.head_dim))
    throw Error(ErrorKind::kUnsupported,
                fmt::format("the model's head_dim {} is not supported by the {} backend (supported: {})",
                            model.head_dim, capabilities.name, fmt::join(capabilities.head_dims, ", ")),
                "serve this model with --device cpu");
  if (model.quantization.fp8() && !capabilities.fp8_weights && !capabilities.dequantizes_fp8_weights)
    throw Error(ErrorKind::kUnsupported,
                fmt::format("the model's FP8 weights ({}) are not supported by the {} backend",
                            describe(model.quantization), capabilities.name),
                "serve a 16-bit checkpoint of the model (cuda: with --quantization fp8 for FP8 weights), or use "
                "--device cpu, which dequantizes FP8 checkpoints to fp32");
  const int32_t multiple = std::max(capabilities.dimension_multiple, 1);
  if (model.hidden_size % multiple != 0 || model.intermediate_size % multiple != 0 || model.q_size() % multiple != 0)
    throw Error(ErrorKind::kUnsupported,
                fmt::format("the model's hidden size {}, intermediate size {} and q size {} must be multiples of {} "
                            "on the {} backend",
                            model.hidden_size, model.intermediate_size, model.q_size(), multiple, capabilities.name),
                "serve this model with --device cpu");
}

}  // namespace loom
