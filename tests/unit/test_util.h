// Small helpers shared by unit tests.
#pragma once

#include <filesystem>
#include <functional>
#include <initializer_list>
#include <string>

#include <nlohmann/json.hpp>

#include "model/loader.h"
#include "util/error.h"

namespace loom::test {

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

// Writes the tiny synthetic Llama (synthetic/synthetic_model.h) with
// `num_adapters` adapters (DIR/adapters/adapterN; alora_invocation: each may be
// served activated) into `directory` and loads it: the model engine suites
// share across their tests (SetUpTestSuite).
LoadedModel write_and_load_synthetic_model(const TempDir& directory, int num_adapters, bool alora_invocation = false);

// Runs `action`, which must throw loom::Error of `kind` whose message contains
// every needle (e.g. the file and tensor it should name); a GoogleTest failure otherwise.
void expect_error(const std::function<void()>& action, ErrorKind kind,
                  std::initializer_list<std::string> needles);

struct CommandResult {
  int exit_code = -1;  // -1 when the command could not start or did not exit normally
  std::string output;  // stdout and stderr together
};
// Runs `command` through the shell (stderr joined to stdout) and waits for it.
CommandResult run_command(const std::string& command);

// <repo>/tests/fixtures/<name>
std::string fixture_path(const std::string& name);
// The built `loom` binary.
std::string loom_binary();
// Path of the SmolLM2 GGUF fetched by the setup script, or "" if absent
// ($LOOM_SMOLLM2_GGUF, else ~/.cache/loom/models/SmolLM2-135M-Instruct.Q4_1.gguf).
std::string smollm2_gguf_path();

// The whole file as bytes ("" when it cannot be read).
std::string read_file_bytes(const std::filesystem::path& path);
// The __metadata__ object of a safetensors file (golden fixtures).
nlohmann::json safetensors_metadata(const std::filesystem::path& path);
// FNV-1a 64 of `bytes` as 16 hex digits, as the golden tools record model files.
std::string fnv1a64_hex(const std::string& bytes);

}  // namespace loom::test
