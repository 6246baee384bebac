#include <cstdlib>
#include <filesystem>

#include "cli/commands.h"
#include "util/error.h"

namespace loom::cli {

std::string default_model_path() {
  std::filesystem::path home;
  if (const char* loom_home = std::getenv("LOOM_HOME"); loom_home != nullptr && *loom_home != '\0') {
    home = loom_home;
  } else if (const char* user_home = std::getenv("HOME"); user_home != nullptr) {
    home = std::filesystem::path(user_home) / ".cache/loom";
  } else {
    home = ".loom";
  }
  std::filesystem::path path = home / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path))
    throw Error(ErrorKind::kNotFound, "the default model " + path.string() + " is not there",
                "run scripts/setup.sh, which fetches it, or pass --model");
  return path.string();
}

std::string resolve_model_path(const std::string& model_flag) {
  return model_flag.empty() ? default_model_path() : model_flag;
}

}  // namespace loom::cli
