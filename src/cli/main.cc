// `loom` command-line entry point: parses the subcommand, runs it, and turns
// loom::Error into a message and exit status (2 bad input, 1 anything else).
#include <cstdio>
#include <exception>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "cli/vllm_flags.h"
#include "util/version.h"
#include "util/error.h"

int main(int argc, char** argv) {
  CLI::App app{"Loom: LLM serving for multi-agent, multi-LoRA workflows"};
  app.require_subcommand(1);
  app.set_version_flag("--version", loom::kLoomVersion);
  app.option_defaults()->always_capture_default();  // --help shows each option's default
  bool verbose = false;
  std::string log_level = "info";
  app.add_flag("-v,--verbose", verbose, "Debug logging (--log-level debug)");
  app.add_option("--log-level,--uvicorn-log-level", log_level, "debug, info, warning or error (vLLM's spellings too)")
      ->transform(CLI::IsMember({"trace", "debug", "info", "warning", "warn", "error", "critical"},
                                CLI::ignore_case));

  std::map<CLI::App*, loom::cli::CommandRunner> runners;
  auto add = [&](const char* name, const char* description, auto registrar) {
    CLI::App* sub = app.add_subcommand(name, description);
    // The options above also after the subcommand (`loom serve -v`); `bench` hands everything after it to the harness.
    sub->fallthrough(std::string_view(name) != "bench");
    runners[sub] = registrar(*sub);
  };
  add("generate", "Generate text from a prompt or chat messages", loom::cli::register_generate);
  add("convert", "Convert a GGUF file into a Hugging Face directory", loom::cli::register_convert);
  add("make-model", "Write a random model (and PEFT adapters) for tests and benchmarks",
      loom::cli::register_make_model);
  add("serve", "Serve a model and its adapters over an OpenAI-compatible HTTP API", loom::cli::register_serve);
  add("bench", "Benchmark agentic workflows against servers it launches or --url", loom::cli::register_bench);
  add("make-adapters", "Write random PEFT LoRA adapters for an existing model", loom::cli::register_make_adapters);
  add("router", "Route requests over prefill and decode engines (disaggregation, DualPath)",
      loom::cli::register_router);
  add("divergence", "Measure how far KV sharing modes move adapters from isolated", loom::cli::register_divergence);

  std::vector<std::string> arguments(argv, argv + argc);
  std::vector<char*> rewritten;
  for (std::string& argument : arguments) {
    argument = loom::cli::long_vllm_spelling(argument);
    rewritten.push_back(argument.data());
  }
  try {
    // A value parse_byte_size refuses is an Error out of the parse (commands.h's byte_size_transform(flag)).
    CLI11_PARSE(app, argc, rewritten.data());
    // Logs go to stderr, so stdout holds only a command's output (`loom generate --json | jq`).
    spdlog::set_default_logger(spdlog::stderr_color_mt("loom"));
    spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
    spdlog::set_level(verbose ? spdlog::level::debug
                              : spdlog::level::from_str(log_level == "warning" ? "warn" : log_level));
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
