// `loom` command-line entry point: parses the subcommand, runs it, and turns
// loom::Error into a message and exit status (2 bad input, 1 anything else).
#include <cstdio>
#include <exception>
#include <map>

#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"Loom: LLM serving for multi-agent, multi-LoRA workflows"};
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "Debug logging");

  std::map<CLI::App*, loom::cli::CommandRunner> runners;
  auto add = [&](const char* name, const char* description, auto registrar) {
    CLI::App* sub = app.add_subcommand(name, description);
    runners[sub] = registrar(*sub);
  };
  add("generate", "Generate text from a prompt or chat messages", loom::cli::register_generate);
  add("convert", "Convert a GGUF file into a Hugging Face directory", loom::cli::register_convert);
  add("make-model", "Write a random model (and PEFT adapters) for tests and benchmarks",
      loom::cli::register_make_model);
  add("serve", "Serve a model and its adapters over an OpenAI-compatible HTTP API", loom::cli::register_serve);
  add("bench", "Benchmark agentic workflows against servers it launches or --url", loom::cli::register_bench);
  add("make-adapters", "Write random PEFT LoRA adapters for an existing model", loom::cli::register_make_adapters);
  add("divergence", "Measure how far KV sharing modes move adapters from isolated", loom::cli::register_divergence);

  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(verbose ? spdlog::level::debug : spdlog::level::info);
  spdlog::set_default_logger(spdlog::default_logger());
  try {
    for (auto& [sub, runner] : runners)
      if (sub->parsed()) return runner();
  } catch (const loom::Error& error) {
    std::fprintf(stderr, "loom: error (%s): %s\n", loom::error_kind_name(error.kind()), error.what());
    return error.kind() == loom::ErrorKind::kInternal ? 1 : 2;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "loom: error: %s\n", error.what());
    return 1;
  }
  return 1;
}
