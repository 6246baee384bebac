// `loom generate`: one-shot generation on the CPU backend, through the Engine.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "backend/cpu/cpu_backend.h"
#include "chat/chat_renderer.h"
#include "cli/commands.h"
#include "cli/device_backend.h"
#include "cli/vllm_flags.h"
#include "engine/engine.h"
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
  std::string chat_template;  // --chat-template FILE|STRING
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
  int64_t kv_cache_bytes = 0;  // 0: what the requests need
  int threads = 0;
  int tensor_parallel_size = 1;
  std::string quantization;  // "" or fp8 (cuda)
  std::string kv_cache_dtype = "auto";  // parse_kv_cache_dtype (vllm_flags.h)
  std::string cpu_precision = "auto";
  bool enforce_eager = false;  // cuda: no CUDA graphs
  bool disable_custom_all_reduce = false;  // cuda -tp: every sum on NCCL
  std::string device = "cpu";
  std::vector<KvSharing> disabled_kv_sharing;
};

// --messages: a JSON list of chat messages, as a chat request's `messages`.
nlohmann::ordered_json parse_messages(const std::string& text) {
  nlohmann::ordered_json json;
  try {
    json = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& error) {
    throw Error(ErrorKind::kInvalidArgument, std::string("--messages is not valid JSON: ") + error.what());
  }
  if (!json.is_array() || json.empty())
    fail(ErrorKind::kInvalidArgument, "--messages must be a non-empty JSON array of {{role, content}}");
  for (const auto& item : json)
    if (!item.is_object() || !item.contains("role") || !item["role"].is_string())
      fail(ErrorKind::kInvalidArgument, "each message needs a string 'role'");
  return json;
}

// Runs through the serving Engine (scheduler, prefix cache, KV sharing modes)
// rather than the offline Generator, so that every --lora MODE behaves as in
// `loom serve`: activated masks, base-mode decoder rows, forked rCache.
int run_generate(const GenerateOptions& options) {
  if (options.prompts.empty() && options.messages_json.empty())
    fail(ErrorKind::kInvalidArgument, "give --prompt TEXT or --messages JSON");
  std::vector<LoraSpec> specs;
  for (const auto& spec_text : options.loras) specs.push_back(parse_lora_spec(spec_text));
  if (!options.adapter.empty() &&
      std::none_of(specs.begin(), specs.end(), [&](const LoraSpec& spec) { return spec.name == options.adapter; }))
    throw Error(ErrorKind::kNotFound, "unknown adapter '" + options.adapter + "'",
                "load it with --lora " + options.adapter + "=PATH");

  const KvCacheDtype kv_cache_dtype = parse_kv_cache_dtype(options.kv_cache_dtype, options.device);
  const auto load_start = std::chrono::steady_clock::now();
  DeviceOptions device_options{options.device, options.threads, 64, !options.enforce_eager,
                               cpu_precision_keeps_quantized(options.cpu_precision), options.tensor_parallel_size,
                               options.quantization == "fp8", kv_cache_dtype};
  device_options.custom_all_reduce = !options.disable_custom_all_reduce;
  ModelOnDevice loaded = load_model_on_device(options.model, device_options);
  LoadedModel model = std::move(loaded.model);
  std::unique_ptr<Backend> backend = std::move(loaded.backend);
  std::shared_ptr<const Tokenizer> tokenizer_owner = model.tokenizer;
  const Tokenizer& tokenizer = *tokenizer_owner;
  // The server's renderer: the model's template (or --chat-template) through the Jinja interpreter.
  const ChatRenderer chat_renderer(tokenizer.model_chat_templates(),
                                   options.chat_template.empty() ? std::string()
                                                                 : load_chat_template_argument(options.chat_template));
  const auto render_chat = [&](nlohmann::ordered_json messages) {
    ChatRequest request;
    request.messages = std::move(messages);
    return tokenizer.encode(chat_renderer.render(request), false);
  };
  std::vector<std::vector<TokenId>> prompt_tokens;
  if (!options.messages_json.empty()) prompt_tokens.push_back(render_chat(parse_messages(options.messages_json)));
  for (const auto& prompt : options.prompts) {
    if (options.raw) {
      prompt_tokens.push_back(tokenizer.encode(prompt, true));
    } else {
      nlohmann::ordered_json messages = nlohmann::ordered_json::array();
      if (!options.system_prompt.empty()) messages.push_back({{"role", "system"}, {"content", options.system_prompt}});
      messages.push_back({{"role", "user"}, {"content", prompt}});
      prompt_tokens.push_back(render_chat(std::move(messages)));
    }
  }

  EngineConfig engine_config;
  engine_config.block_size = options.block_size;
  engine_config.kv_cache_dtype = kv_cache_dtype;
  engine_config.fp8_weights = options.quantization == "fp8";
  engine_config.disabled_kv_sharing = options.disabled_kv_sharing;
  if (options.kv_cache_bytes > 0) {
    engine_config.kv_cache_bytes = options.kv_cache_bytes;
  } else {  // room for every request at once, and no more (as the offline Generator did)
    // Capped at the context: longer requests fail at submit with a clear error.
    const int64_t max_context = model.config.max_position_embeddings;
    int64_t num_blocks = 0;
    for (const auto& prompt : prompt_tokens) {
      const int64_t num_tokens = std::min<int64_t>(static_cast<int64_t>(prompt.size()) + options.max_tokens, max_context);
      num_blocks += (num_tokens + options.block_size - 1) / options.block_size;
    }
    engine_config.num_kv_blocks = static_cast<int32_t>(std::clamp<int64_t>(num_blocks, 1, 1 << 30));
    engine_config.num_residual_kv_blocks = engine_config.num_kv_blocks;  // used only if an adapter is forked
  }
  std::unique_ptr<Engine> engine = make_engine(std::move(model), std::move(backend), engine_config);
  for (const LoraSpec& spec : specs) engine->load_adapter(spec.name, spec.path, spec.sharing);
  std::string adapter = options.adapter;
  if (adapter.empty() && specs.size() == 1) adapter = specs.front().name;
  for (const AdapterInfo& info : engine->adapters())
    if (info.name == adapter) spdlog::debug("adapter '{}' with kv_sharing {}", info.name, kv_sharing_name(info.sharing));
  const double load_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();

  // Every request is queued before any is read, so they run as one batch.
  const auto generate_start = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (size_t i = 0; i < prompt_tokens.size(); ++i) {
    EngineRequest request;
    request.prompt_tokens = prompt_tokens[i];
    request.adapter = adapter;
    request.sampling.temperature = options.temperature;
    request.sampling.top_k = options.top_k;
    request.sampling.top_p = options.top_p;
    request.sampling.seed = options.seed + i;
    request.sampling.num_top_logprobs = options.logprobs;
    request.max_new_tokens = options.max_tokens;
    request.stop_strings = options.stops;
    request.ignore_eos = options.ignore_eos;
    streams.push_back(engine->submit(std::move(request)));
  }
  const bool stream = !options.json && streams.size() == 1;
  std::vector<GenerationResult> results(streams.size());
  for (size_t i = 0; i < streams.size(); ++i) {
    for (;;) {
      std::optional<RequestOutput> output = streams[i]->next(std::chrono::seconds(3600));
      if (!output) throw Error(ErrorKind::kInternal, "the engine produced nothing for an hour");
      if (output->error) throw *output->error;
      for (auto& token : output->new_tokens) results[i].tokens.push_back(std::move(token));
      results[i].text += output->text_delta;
      if (stream) {
        std::fwrite(output->text_delta.data(), 1, output->text_delta.size(), stdout);
        std::fflush(stdout);
      }
      if (output->finished) {
        results[i].finish_reason = output->finish_reason;
        break;
      }
    }
  }
  engine->shutdown(true);
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
  app.add_option("--lora", options->loras,
                 "Adapter NAME=PATH[:MODE] (repeatable; MODE: isolated, activated, base, forked)");
  app.add_option("--adapter", options->adapter, "Adapter to generate with (default: the only --lora, else base)");
  app.add_option("--prompt", options->prompts, "User prompt (repeatable: prompts run as one batch)");
  app.add_option("--messages", options->messages_json, "Chat messages as a JSON array of {role, content}");
  app.add_option("--chat-template", options->chat_template,
                 "Jinja chat template replacing the model's: a file, or the template text");
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
  app.add_option("--kv-cache-bytes", options->kv_cache_bytes,
                 "KV cache pool size: BYTES, suffix K, M, G allowed (0 = what the prompts need)")
      ->transform(byte_size_transform())
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", options->threads, "CPU threads (0 = all cores)");
  app.add_option("--tensor-parallel-size", options->tensor_parallel_size,
                 "Ranks the model is sharded over (-tp). cpu: threads of one process, fp32 weights; cuda: one GPU per "
                 "rank (cuda:K..K+N-1), NCCL all-reduces")
      ->check(CLI::PositiveNumber);
  app.add_option("--quantization", options->quantization,
                 "fp8 (--device cuda): linear weights quantized to e4m3 at load, one scale per matrix")
      ->check(CLI::IsMember({"", "fp8"}));
  app.add_option("--kv-cache-dtype", options->kv_cache_dtype,
                 "auto (the backend's own: cpu float32, cuda bfloat16), bf16 (cuda), fp8 / fp8_e4m3 (cuda, where the "
                 "backend has an FP8 KV cache)")
      ->capture_default_str();
  app.add_option("--cpu-precision", options->cpu_precision, kCpuPrecisionHelp)
      ->check(CLI::IsMember({"auto", "fp32"}))
      ->capture_default_str();
  app.add_flag("--enforce-eager", options->enforce_eager,
               "cuda: run every step eagerly (default: decode steps replay CUDA graphs captured per batch shape)");
  app.add_flag("--disable-custom-all-reduce", options->disable_custom_all_reduce,
               "cuda, -tp above 1: every all-reduce on NCCL (default: decode-sized sums on one kernel over NVLink "
               "peer access)");
  app.add_option("--device", options->device, "cpu, cuda or cuda:N (builds with the CUDA backend)");
  add_disable_kv_sharing_option(app, options->disabled_kv_sharing);
  return [options] { return run_generate(*options); };
}

}  // namespace loom::cli
