#include "kv/kv_key.h"

#include <algorithm>
#include <cctype>

#include "util/error.h"

namespace loom {

namespace {
constexpr std::string_view kIsolatedPrefix = "lora/";
constexpr std::string_view kActivatedPrefix = "alora/";
constexpr std::string_view kResidualPrefix = "resid/";
}  // namespace

std::string isolated_kv_namespace(const std::string& adapter_name) {
  return std::string(kIsolatedPrefix) + adapter_name;
}

std::string residual_kv_namespace(const std::string& adapter_name) {
  return std::string(kResidualPrefix) + adapter_name;
}

KvKey activated_kv_key(const std::string& adapter_name, int32_t invocation_start, int32_t block_size) {
  LOOM_CHECK(invocation_start >= 0 && block_size > 0);
  return KvKey{kBaseKvNamespace, std::string(kActivatedPrefix) + adapter_name + "@" + std::to_string(invocation_start),
               invocation_start / block_size};
}

bool kv_namespace_belongs_to_adapter(const std::string& kv_namespace, const std::string& adapter_name) {
  return adapter_of_kv_namespace(kv_namespace) == adapter_name;
}

std::optional<std::string> adapter_of_kv_namespace(std::string_view kv_namespace) {
  for (std::string_view prefix : {kIsolatedPrefix, kResidualPrefix})
    if (kv_namespace.starts_with(prefix)) return std::string(kv_namespace.substr(prefix.size()));
  if (!kv_namespace.starts_with(kActivatedPrefix)) return std::nullopt;
  // "alora/NAME@S" with S one or more digits: NAME ends at the last '@', so that
  // adapter "a" does not claim "alora/a@b@5" (adapter "a@b").
  const std::string_view rest = kv_namespace.substr(kActivatedPrefix.size());
  const size_t at = rest.rfind('@');
  if (at == std::string_view::npos) return std::nullopt;
  const std::string_view start = rest.substr(at + 1);
  if (start.empty() || !std::all_of(start.begin(), start.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
    return std::nullopt;
  return std::string(rest.substr(0, at));
}

}  // namespace loom
