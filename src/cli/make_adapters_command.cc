// `loom make-adapters`: random PEFT LoRA adapters for an existing model (a
// GGUF file or a Hugging Face directory), for benchmarks of the KV sharing
// modes with the real default model instead of a synthetic one.
//
// Writes OUT/adapter0 .. OUT/adapter{N-1}, each adapter_config.json +
// adapter_model.safetensors (f32) that `loom serve --lora` and PEFT load.
// Weights come from the synthetic adapter helpers (synthetic/synthetic_model.h): A
// uniform / sqrt(fan_in), B non-zero, deterministic in (seed, adapter name,
// tensor name). Every adapter targets the same modules at the same rank
// (--targets, default all seven projections), so bytes per agent compare
// like with like. --alora-invocation-text stores the text's tokens (this
// model's tokenizer, no special tokens added) as alora_invocation_tokens; a
// prompt must contain exactly these tokens for the activated mode to start
// the adapter (the pre-tokenizer splits at a newline, so "\nTEXT" keeps them).
#include <filesystem>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "cli/device_backend.h"
#include "model/loader.h"
#include "synthetic/synthetic_model.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace loom::cli {
namespace {

struct MakeAdaptersFlags {
  std::string model;
  int num_adapters = 8;
  int rank = 16;
  float alpha = 32.0f;
  std::string targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
  std::string alora_invocation_text;
  uint64_t seed = 0;
  std::string out;
};

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream stream(text);
  for (std::string part; std::getline(stream, part, ',');)
    if (!part.empty()) parts.push_back(part);
  return parts;
}

int run_make_adapters(const MakeAdaptersFlags& flags) {
  if (flags.num_adapters < 1) fail(ErrorKind::kInvalidArgument, "--adapters must be at least 1, got {}", flags.num_adapters);
  const LoadedModel model = load_model_description(flags.model);
  const std::string& model_path = model.path;

  SyntheticModelOptions options;
  options.num_adapters = flags.num_adapters;
  options.rank = flags.rank;
  options.alpha = flags.alpha;
  options.targets = split_commas(flags.targets);
  options.seed = flags.seed;
  if (options.targets.empty()) fail(ErrorKind::kInvalidArgument, "--targets: no module named");
  std::vector<SyntheticAdapterSpec> specs = synthetic_adapter_specs(options, model.config);

  std::vector<int> invocation_tokens;
  if (!flags.alora_invocation_text.empty()) {
    if (!model.tokenizer) fail(ErrorKind::kInvalidArgument, "{}: the model has no tokenizer for --alora-invocation-text", model_path);
    for (TokenId id : model.tokenizer->encode(flags.alora_invocation_text, /*add_special_tokens=*/false))
      invocation_tokens.push_back(static_cast<int>(id));
    if (invocation_tokens.empty())
      fail(ErrorKind::kInvalidArgument, "--alora-invocation-text '{}' encodes to no token", flags.alora_invocation_text);
  }

  std::filesystem::create_directories(flags.out);
  for (SyntheticAdapterSpec& spec : specs) {
    spec.config.alora_invocation_tokens = invocation_tokens;
    spec.config.base_model_name_or_path = model_path;
    const LoraAdapter adapter = make_synthetic_adapter(spec, model.config, flags.seed);
    const std::string directory = (std::filesystem::path(flags.out) / spec.name).string();
    write_lora_adapter(directory, adapter, model.config, StoredDtype::kF32);
    spdlog::info("wrote {} (rank {}, alpha {}, {})", directory, spec.config.rank, spec.config.alpha,
                 fmt::join(spec.config.target_modules, ","));
  }
  if (!invocation_tokens.empty())
    spdlog::info("alora_invocation_tokens {} for '{}'", fmt::join(invocation_tokens, ","), flags.alora_invocation_text);
  return 0;
}

}  // namespace

CommandRunner register_make_adapters(CLI::App& app) {
  auto flags = std::make_shared<MakeAdaptersFlags>();
  app.add_option("--model", flags->model,
                 "Base model: GGUF file, HF directory or random:[ARCH-]PRESET (default: the built-in model)");
  app.add_option("--adapters", flags->num_adapters, "Number of adapters (OUT/adapter0 ...)")->capture_default_str();
  app.add_option("--rank", flags->rank, "LoRA rank of every module")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--alpha", flags->alpha, "LoRA alpha")->capture_default_str();
  app.add_option("--targets", flags->targets, "Comma-separated modules every adapter targets")->capture_default_str();
  app.add_option("--alora-invocation-text", flags->alora_invocation_text,
                 "Write alora_invocation_tokens = this text's tokens (activated LoRA)");
  app.add_option("--seed", flags->seed, "Seed (same seed, same bytes)")->capture_default_str();
  app.add_option("--out", flags->out, "Output directory")->required();
  return [flags] { return run_make_adapters(*flags); };
}

}  // namespace loom::cli
