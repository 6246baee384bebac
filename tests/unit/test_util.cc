#include "test_util.h"

#include <array>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <cstdlib>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "synthetic/synthetic_model.h"

namespace loom::test {

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  path_ = std::filesystem::temp_directory_path() /
          ("loom_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  std::filesystem::remove_all(path_);
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

LoadedModel write_and_load_synthetic_model(const TempDir& directory, int num_adapters, bool alora_invocation) {
  SyntheticModelOptions options;
  options.num_adapters = num_adapters;
  options.alora_invocation = alora_invocation;
  write_synthetic_model(directory.str(), options);
  return load_model(directory.str());
}

void expect_error(const std::function<void()>& action, ErrorKind kind,
                  std::initializer_list<std::string> needles) {
  try {
    action();
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), kind) << error.what();
    for (const std::string& needle : needles)
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos)
          << "message \"" << error.what() << "\" lacks \"" << needle << "\"";
    return;
  }
  ADD_FAILURE() << "no loom::Error thrown";
}

CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer{};
  size_t count;
  while ((count = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), count);
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string fixture_path(const std::string& name) {
  return std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/" + name;
}

std::string loom_binary() { return LOOM_BINARY; }

std::string smollm2_gguf_path() {
  if (const char* env = std::getenv("LOOM_SMOLLM2_GGUF"); env != nullptr && *env != '\0')
    return std::filesystem::exists(env) ? env : "";
  const char* home = std::getenv("HOME");
  if (home == nullptr) return "";
  std::filesystem::path path =
      std::filesystem::path(home) / ".cache/loom/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  return std::filesystem::exists(path) ? path.string() : "";
}

std::string read_file_bytes(const std::filesystem::path& path) {
  std::ifstream stream(path, std::ios::binary);
  std::stringstream bytes;
  bytes << stream.rdbuf();
  return bytes.str();
}

nlohmann::json safetensors_metadata(const std::filesystem::path& path) {
  const std::string bytes = read_file_bytes(path);
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= static_cast<uint64_t>(static_cast<uint8_t>(bytes.at(i))) << (8 * i);
  return nlohmann::json::parse(bytes.substr(8, length)).at("__metadata__");
}

std::string fnv1a64_hex(const std::string& bytes) {
  uint64_t hash = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ull;
  }
  return fmt::format("{:016x}", hash);
}

}  // namespace loom::test
