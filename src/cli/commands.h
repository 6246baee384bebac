// Subcommands of the `loom` binary. Each registers its flags on the CLI11 app
// and returns the function to run once parsing succeeded.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "lora/kv_sharing.h"

namespace loom::cli {

using CommandRunner = std::function<int()>;

CommandRunner register_generate(CLI::App& app);
CommandRunner register_convert(CLI::App& app);
CommandRunner register_make_model(CLI::App& app);
CommandRunner register_serve(CLI::App& app);
CommandRunner register_bench(CLI::App& app);  // bench_command.cc: runs bench/harness (Python)
CommandRunner register_divergence(CLI::App& app);  // divergence_command.cc: KV sharing divergence
CommandRunner register_make_adapters(CLI::App& app);  // make_adapters_command.cc: random adapters for a model
CommandRunner register_router(CLI::App& app);  // router_command.cc: the prefill/decode front end (DualPath)

// A --lora flag value: NAME=PATH[:MODE]. A trailing ":word" with no '/' after
// it is the KV sharing mode (isolated, activated, base, forked; see
// lora/kv_sharing.h); without it the adapter's own choice applies
// (choose_kv_sharing). Throws Error(kInvalidArgument) with a hint.
struct LoraSpec {
  std::string name, path, mode;
  std::optional<KvSharing> sharing;  // parsed `mode`; nullopt when absent
};
LoraSpec parse_lora_spec(const std::string& spec);

// Registers `--disable-kv-sharing MODE[,MODE]` (repeatable; isolated, activated,
// base, forked): the KV sharing modes the operator forbids, written to `modes`
// (EngineConfig::disabled_kv_sharing), which must outlive parsing.
void add_disable_kv_sharing_option(CLI::App& app, std::vector<KvSharing>& modes);

// "4096", "512K", "64M", "2G" (powers of 1024; a trailing "B"/"iB" allowed)
// -> bytes. Throws Error(kInvalidArgument) naming `flag` for anything else.
int64_t parse_byte_size(const std::string& text, const std::string& flag);
// The same syntax as a CLI11 transform, for options bound to integers.
CLI::Validator byte_size_transform();
// The same for `loom serve`'s sizes, naming `flag` in a bad size's error as
// parse_byte_size does: that error is an Error(kInvalidArgument) thrown out of
// CLI11's parse (main.cc reports it, exit status 2, as the command's own errors).
CLI::Validator byte_size_transform(const std::string& flag);
// The same where "auto" is also accepted: it becomes -1.
CLI::Validator byte_size_or_auto_transform(const std::string& flag);

// The built-in default model: $LOOM_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf,
// LOOM_HOME defaulting to ~/.cache/loom. Throws Error(kNotFound) with a hint to
// run the setup script when it is absent.
std::string default_model_path();
// `--model` if given, else the default.
std::string resolve_model_path(const std::string& model_flag);

}  // namespace loom::cli
