// `loom generate`: one-shot generation on the CPU backend.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "backend/cpu/cpu_backend.h"
#include "cli/commands.h"
#include "engine/generator.h"
#include "lora/adapter.h"
#include "model/loader.h"
#include "util/error.h"

namespace loom::cli {
namespace {

struct GenerateOptions {
  std::string model;
  std::vector<std::string> loras;  // NAME=PATH[:MODE]
  std::string adapter;
  std::vector<std::string> prompts;
  std::string messages_json;
  std::string system_prompt;
  bool raw = false;
  int max_tokens = 128;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  std::vector<std::string> stops;
  bool ignore_eos = false;
  int logprobs = 0;
  bool json = false;
  int block_size = 16;
  int threads = 0;
  std::string device = "cpu";
};

std::vector<ChatMessage> parse_messages(const std::string& text) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& error) {
    throw Error(ErrorKind::kInvalidArgument, std::string("--messages is not valid JSON: ") + error.what());
  }
  if (!json.is_array() || json.empty())
    fail(ErrorKind::kInvalidArgument, "--messages must be a non-empty JSON array of {{role, content}}");
  std::vector<ChatMessage> messages;
  for (const auto& item : json) {
    if (!item.is_object() || !item.contains("role") || !item["role"].is_string() ||
        !item.contains("content") || !item["content"].is_string())
      fail(ErrorKind::kInvalidArgument, "each message needs string 'role' and 'content'");
    messages.push_back({item["role"].get<std::string>(), item["content"].get<std::string>()});
  }
  return messages;
}

int run_generate(const GenerateOptions& options) {
  if (options.device != "cpu")
    throw Error(ErrorKind::kUnsupported, "--device " + options.device, "this build has only --device cpu");
  if (options.prompts.empty() && options.messages_json.empty())
    fail(ErrorKind::kInvalidArgument, "give --prompt TEXT or --messages JSON");

  const auto load_start = std::chrono::steady_clock::now();
  LoadedModel model = load_model(resolve_model_path(options.model));
  CpuBackendConfig backend_config;
  backend_config.num_threads = options.threads;
  std::unique_ptr<Backend> backend = make_cpu_backend(model.config, model.weights, backend_config);

  std::map<std::string, int32_t> adapter_slots;
  for (const auto& spec_text : options.loras) {
    LoraSpec spec = parse_lora_spec(spec_text);
    if (adapter_slots.count(spec.name)) fail(ErrorKind::kInvalidArgument, "adapter '{}' given twice", spec.name);
    const int32_t slot = static_cast<int32_t>(adapter_slots.size());
    backend->set_adapter(slot, load_lora_adapter(spec.name, spec.path, model.config));
    adapter_slots[spec.name] = slot;
  }
  int32_t adapter_slot = -1;
  if (!options.adapter.empty()) {
    auto found = adapter_slots.find(options.adapter);
    if (found == adapter_slots.end())
      throw Error(ErrorKind::kNotFound, "unknown adapter '" + options.adapter + "'",
                  "load it with --lora " + options.adapter + "=PATH");
    adapter_slot = found->second;
  } else if (adapter_slots.size() == 1) {
    adapter_slot = adapter_slots.begin()->second;
  }
  const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();

  const Tokenizer& tokenizer = *model.tokenizer;
  std::vector<std::vector<TokenId>> prompt_tokens;
  if (!options.messages_json.empty()) {
    std::string rendered = tokenizer.chat_template().render(parse_messages(options.messages_json));
    prompt_tokens.push_back(tokenizer.encode(rendered, false));
  }
  for (const auto& prompt : options.prompts) {
    if (options.raw) {
      prompt_tokens.push_back(tokenizer.encode(prompt, true));
    } else {
      std::vector<ChatMessage> messages;
      if (!options.system_prompt.empty()) messages.push_back({"system", options.system_prompt});
      messages.push_back({"user", prompt});
      prompt_tokens.push_back(tokenizer.encode(tokenizer.chat_template().render(messages), false));
    }
  }

  std::vector<GenerationRequest> requests;
  for (size_t i = 0; i < prompt_tokens.size(); ++i) {
    GenerationRequest request;
    request.prompt_tokens = prompt_tokens[i];
    request.adapter_slot = adapter_slot;
    request.sampling = {options.temperature, options.top_k, options.top_p, options.seed + i, options.logprobs};
    request.max_new_tokens = options.max_tokens;
    request.stop_strings = options.stops;
    request.ignore_eos = options.ignore_eos;
    requests.push_back(std::move(request));
  }

  GeneratorConfig generator_config;
  generator_config.block_size = options.block_size;
  generator_config.max_context_tokens = model.config.max_position_embeddings;
  Generator generator(*backend, model.tokenizer, generator_config);
  const bool stream = !options.json && requests.size() == 1;
  const auto generate_start = std::chrono::steady_clock::now();
  auto results = generator.generate(requests, [&](size_t, const std::string& delta) {
    if (stream) {
      std::fwrite(delta.data(), 1, delta.size(), stdout);
      std::fflush(stdout);
    }
  });
  const double generate_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - generate_start).count();

  if (options.json) {
    nlohmann::json output = nlohmann::json::array();
    for (size_t i = 0; i < results.size(); ++i) {
      nlohmann::json item;
      item["prompt_tokens"] = prompt_tokens[i];
      nlohmann::json tokens = nlohmann::json::array(), logprobs = nlohmann::json::array(),
                     top = nlohmann::json::array();
      for (const auto& sampled : results[i].tokens) {
        tokens.push_back(sampled.token_id);
        logprobs.push_back(sampled.logprob);
        nlohmann::json alternatives = nlohmann::json::array();
        for (const auto& [id, logprob] : sampled.top_logprobs) alternatives.push_back({id, logprob});
        top.push_back(alternatives);
      }
      item["tokens"] = tokens;
      item["logprobs"] = logprobs;
      if (options.logprobs > 0) item["top_logprobs"] = top;
      item["text"] = results[i].text;
      item["finish_reason"] = finish_reason_name(results[i].finish_reason);
      output.push_back(item);
    }
    std::cout << (output.size() == 1 ? output[0] : output).dump(2) << "\n";
  } else if (stream) {
    std::cout << "\n";
  } else {
    for (size_t i = 0; i < results.size(); ++i) std::cout << "[" << i << "] " << results[i].text << "\n";
  }
  size_t num_generated = 0;
  for (const auto& result : results) num_generated += result.tokens.size();
  spdlog::info("loaded in {:.2f} s; generated {} tokens in {:.2f} s ({:.1f} tokens/s)", load_seconds,
               num_generated, generate_seconds, num_generated / std::max(generate_seconds, 1e-9));
  return 0;
}

}  // namespace

CommandRunner register_generate(CLI::App& app) {
  auto options = std::make_shared<GenerateOptions>();
  app.add_option("--model", options->model, "Hugging Face directory or .gguf file (default: built-in SmolLM2-135M)");
  app.add_option("--lora", options->loras, "Adapter NAME=PATH[:MODE] (repeatable)");
  app.add_option("--adapter", options->adapter, "Adapter to generate with (default: the only --lora, else base)");
  app.add_option("--prompt", options->prompts, "User prompt (repeatable: prompts run as one batch)");
  app.add_option("--messages", options->messages_json, "Chat messages as a JSON array of {role, content}");
  app.add_option("--system", options->system_prompt, "System prompt for --prompt");
  app.add_flag("--raw", options->raw, "Use --prompt as raw text (no chat template)");
  app.add_option("--max-tokens", options->max_tokens, "Tokens to generate at most")->check(CLI::NonNegativeNumber);
  app.add_option("--temperature", options->temperature, "0 = greedy")->check(CLI::NonNegativeNumber);
  app.add_option("--top-k", options->top_k, "0 = off")->check(CLI::NonNegativeNumber);
  app.add_option("--top-p", options->top_p, "1 = off")->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", options->seed, "Sampling seed");
  app.add_option("--stop", options->stops, "Stop string (repeatable)");
  app.add_flag("--ignore-eos", options->ignore_eos, "Keep going past end-of-sequence tokens");
  app.add_option("--logprobs", options->logprobs, "Top alternatives per token in --json output");
  app.add_flag("--json", options->json, "Print token ids, logprobs and text as JSON");
  app.add_option("--block-size", options->block_size, "KV block size in tokens")->check(CLI::PositiveNumber);
  app.add_option("--threads", options->threads, "CPU threads (0 = all cores)");
  app.add_option("--device", options->device, "cpu (cuda arrives with the CUDA backend)");
  return [options] { return run_generate(*options); };
}

}  // namespace loom::cli
