#include "server/generation_defaults.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "util/error.h"

namespace loom::server {

SamplingDefaults read_generation_config(const std::string& directory) {
  SamplingDefaults defaults;
  const std::filesystem::path path = std::filesystem::path(directory) / "generation_config.json";
  std::ifstream file(path);
  if (!file) return defaults;
  const nlohmann::json config = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) fail(ErrorKind::kFormat, "{}: not a JSON object", path.string());
  auto number = [&](const char* key, double& value, double low, double high) {
    const auto it = config.find(key);
    if (it == config.end() || it->is_null()) return;
    if (!it->is_number() || it->get<double>() < low || it->get<double>() > high)
      fail(ErrorKind::kFormat, "{}: '{}' must be a number in [{}, {}]", path.string(), key, low, high);
    value = it->get<double>();
  };
  number("temperature", defaults.temperature, 0.0, 2.0);
  number("top_p", defaults.top_p, 1e-9, 1.0);
  number("min_p", defaults.min_p, 0.0, 1.0);
  number("repetition_penalty", defaults.repetition_penalty, 1e-9, 100.0);
  double top_k = static_cast<double>(defaults.top_k);
  number("top_k", top_k, -1.0, 2147483647.0);
  defaults.top_k = static_cast<int64_t>(top_k);
  defaults.source = path.string();
  return defaults;
}

}  // namespace loom::server
