// `loom make-model`: random models (and PEFT adapters) for tests and benchmarks.
#include <sstream>

#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "synthetic/synthetic_model.h"

namespace loom::cli {
namespace {

struct MakeModelFlags {
  std::string arch = "llama";
  std::string preset = "tiny";
  int num_adapters = 0;
  int rank = 8;
  float alpha = 16.0f;
  std::string targets;
  bool use_rslora = false;
  bool alora = false;
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

}  // namespace

CommandRunner register_make_model(CLI::App& app) {
  auto flags = std::make_shared<MakeModelFlags>();
  app.add_option("--arch", flags->arch, "llama | qwen2 | qwen3 | mistral")->capture_default_str();
  app.add_option("--preset", flags->preset, "tiny (tests) | 8b (Llama-3-8B shapes, bf16, 16 GB) | 14b (Qwen3-14B shapes, bf16, 30 GB) | 70b (Llama-3-70B shapes, bf16, 141 GB)")->capture_default_str();
  app.add_option("--adapters", flags->num_adapters, "PEFT adapters to write into OUT/adapters/")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--rank", flags->rank, "LoRA rank")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--alpha", flags->alpha, "LoRA alpha")->capture_default_str();
  app.add_option("--targets", flags->targets, "Comma-separated modules for every adapter (default: a variety)");
  app.add_flag("--rslora", flags->use_rslora, "rsLoRA scaling on every adapter");
  app.add_flag("--alora", flags->alora, "Write alora_invocation_tokens (activated LoRA)");
  app.add_option("--seed", flags->seed, "Seed (same seed, same bytes on every machine)");
  app.add_option("--out", flags->out, "Output directory")->required();
  return [flags] {
    SyntheticModelOptions options;
    options.arch = architecture_from_short_name(flags->arch);
    options.preset = synthetic_preset_from_name(flags->preset);
    options.num_adapters = flags->num_adapters;
    options.rank = flags->rank;
    options.alpha = flags->alpha;
    options.targets = split_commas(flags->targets);
    options.use_rslora = flags->use_rslora;
    options.alora_invocation = flags->alora;
    options.seed = flags->seed;
    write_synthetic_model(flags->out, options);
    spdlog::info("wrote {} {} model with {} adapters to {}", flags->preset, flags->arch, flags->num_adapters,
                 flags->out);
    return 0;
  };
}

}  // namespace loom::cli
