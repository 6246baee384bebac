#include "cli/vllm_flags.h"

#include <climits>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "util/error.h"

namespace loom::cli {
namespace {

constexpr const char* kGroup = "vLLM compatibility (vLLM's spellings; see docs/vllm-migration.md)";

// vLLM flags Loom has no equivalent of, with what to do instead.
const std::map<std::string, std::string>& refused_flags() {
  static const std::map<std::string, std::string> flags = {
      {"--swap-space", "Loom's host tier keeps evicted KV blocks instead: --host-kv-memory BYTES"},
      {"--kv-transfer-config",
       "Loom's KV tiers are built in: --host-kv-memory BYTES, and for a disk or shared-storage store (LMCache-, "
       "Mooncake-style) --disk-kv-path DIR --disk-kv-bytes BYTES; for prefill/decode disaggregation (NIXL-style "
       "P/D) start engines with --role prefill|decode behind `loom router`"},
      {"--kv-offloading-size", "Loom's host tier: --host-kv-memory BYTES (and --disk-kv-path DIR below it)"},
      {"--cpu-offload-gb", "Loom keeps the weights on the device; nothing to offload"},
      {"--speculative-config", "Loom has no speculative decoding"},
      {"--speculative-model", "Loom has no speculative decoding"},
      {"--num-speculative-tokens", "Loom has no speculative decoding"},
      {"--tokenizer", "Loom reads the tokenizer from the model directory or GGUF file"},
      {"--tokenizer-mode", "Loom reads the tokenizer from the model directory or GGUF file"},
      {"--download-dir", "Loom never downloads: give a local directory or GGUF file to --model"},
      {"--revision", "Loom never downloads: give a local directory or GGUF file to --model"},
      {"--load-format", "Loom reads safetensors directories and GGUF files by their contents"},
      {"--max-cpu-loras", "every adapter loaded stays in memory; --max-loras-per-batch bounds one batch"},
      {"--lora-dtype", "adapters run in the backend's dtype"},
      {"--distributed-executor-backend", "Loom's tensor-parallel ranks are threads of one process: no executor to choose"},
      {"--data-parallel-size", "run one `loom serve` per device, with `loom router` in front"},
      {"--calculate-kv-scales",
       "Loom's FP8 KV cache (--kv-cache-dtype fp8) takes its scales from the checkpoint (compressed-tensors "
       "kv_cache_scheme, k_scale / v_scale) or uses 1.0, as vLLM does without this flag; it does not calibrate"},
      {"--response-role", "chat responses always use the role \"assistant\""},
      {"--ssl-keyfile", "Loom serves plain HTTP: terminate TLS in a proxy"},
      {"--ssl-certfile", "Loom serves plain HTTP: terminate TLS in a proxy"},
      {"--root-path", "serve Loom behind a proxy that strips the path prefix"},
  };
  return flags;
}

}  // namespace

void add_vllm_flags(CLI::App& app, VllmFlags& flags) {
  app.add_option("--lora-modules", flags.lora_modules,
                 "vLLM's --lora: NAME=PATH or {\"name\": ..., \"path\": ...} (several after one flag, or repeated)")
      ->group(kGroup);
  app.add_option("--max-num-seqs", flags.max_num_seqs, "vLLM's name for --max-running-requests")
      ->check(CLI::PositiveNumber)->group(kGroup);
  app.add_option("--max-num-batched-tokens", flags.max_num_batched_tokens, "vLLM's name for --max-batch-tokens")
      ->check(CLI::PositiveNumber)->group(kGroup);
  app.add_option("--max-model-len", flags.max_model_len,
                 "vLLM's name for --max-context-tokens (at most the model's max_position_embeddings)")
      ->check(CLI::PositiveNumber)->group(kGroup);
  app.add_option("--gpu-memory-utilization", flags.gpu_memory_utilization,
                 "vLLM's name for --gpu-memory-fraction (cuda)")
      ->check(CLI::Range(0.0, 1.0))->group(kGroup);
  app.add_option("--max-loras", flags.max_loras, "vLLM's name for --max-loras-per-batch")
      ->check(CLI::PositiveNumber)->group(kGroup);
  flags.seed_option =
      app.add_option("--seed", flags.seed,
                     "Requests without a `seed` get seeds drawn from this one, so a run repeats (default: random)")
          ->group(kGroup);
  app.add_option("--dtype", flags.dtype, "auto, or the backend's own: float32 (cpu), bfloat16 (cuda)")
      ->group(kGroup);
  app.add_option("--kv-cache-dtype", flags.kv_cache_dtype,
                 "auto (the backend's own: cpu float32, cuda bfloat16), bf16 (cuda), fp8 / fp8_e4m3 (cuda, where the "
                 "backend has an FP8 KV cache)")
      ->group(kGroup);
  app.add_option("--quantization", flags.quantization,
                 "fp8 (cuda): linear weights quantized to e4m3 at load, one scale per matrix (vLLM's dynamic fp8); "
                 "GGUF files load as they are (--model FILE.gguf)")
      ->group(kGroup);
  app.add_option("--tensor-parallel-size", flags.tensor_parallel_size,
                 "Ranks the model is sharded over (-tp; a power of two that divides the attention heads). cpu: "
                 "threads of one process, fp32 weights; cuda: one GPU per rank (cuda:K..K+N-1), NCCL all-reduces")
      ->check(CLI::PositiveNumber)->group(kGroup);
  app.add_flag("--disable-custom-all-reduce", flags.disable_custom_all_reduce,
               "cuda, -tp above 1: every all-reduce on NCCL (default: sums of up to 4 MiB, a decode step's, on one "
               "kernel over NVLink peer access)")
      ->group(kGroup);
  app.add_option("--pipeline-parallel-size", flags.pipeline_parallel_size, "1: Loom shards a model over GPUs with --tensor-parallel-size only")
      ->group(kGroup);
  app.add_flag("--no-enable-prefix-caching", flags.no_enable_prefix_caching,
               "Refused: Loom's KV sharing is prefix caching")
      ->group(kGroup);
  app.add_flag("--disable-log-requests", flags.disable_log_requests,
               "No log line per finished or refused request (server errors are still logged)")
      ->group(kGroup);
  app.add_flag("--disable-log-stats", flags.disable_log_stats, "No periodic stats line (--log-stats-interval 0)")
      ->group(kGroup);
  app.add_option("--kv-events-config", flags.kv_events_config,
                 "KV events for KV-aware routers (llm-d, NVIDIA Dynamo), as vLLM publishes them: JSON such as "
                 "{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": \"tcp://*:5557\", "
                 "\"topic\": \"kv-events\"}: msgpack batches of BlockStored / BlockRemoved / AllBlocksCleared on a "
                 "ZMQ PUB socket")
      ->group(kGroup);
  for (const char* accepted : {"--enable-prefix-caching", "--enable-lora", "--enable-chunked-prefill",
                               "--enable-auto-tool-choice", "--trust-remote-code"})
    app.add_flag(std::string(accepted))
        ->description("Accepted: Loom always does this (and never runs code shipped with a model)")
        ->group(kGroup);
  for (const auto& [flag, instead] : refused_flags())
    flags.refused.emplace_back(
        app.add_option(flag)->description("Not in Loom: " + instead)->expected(0, 1)->group(kGroup), instead);
}

void check_vllm_flags(const VllmFlags& flags, const std::string& device) {
  for (const auto& [option, instead] : flags.refused)
    if (option->count() > 0)
      throw Error(ErrorKind::kInvalidArgument, fmt::format("{} is a vLLM flag Loom does not have", option->get_name()),
                  instead);
  if (flags.pipeline_parallel_size != 1)
    throw Error(ErrorKind::kInvalidArgument, "pipeline parallel sizes other than 1 are not supported",
                "shard the model with --tensor-parallel-size instead");
  if (flags.no_enable_prefix_caching)
    throw Error(ErrorKind::kInvalidArgument, "--no-enable-prefix-caching is not supported",
                "Loom's KV sharing across adapters is built on its prefix cache, which is always on");
  const std::string native = device.rfind("cuda", 0) == 0 ? "bfloat16" : "float32";
  const bool native_alias = flags.dtype == native || (native == "bfloat16" && flags.dtype == "bf16") ||
                            (native == "float32" && (flags.dtype == "float" || flags.dtype == "fp32"));
  if (flags.dtype != "auto" && !native_alias)
    throw Error(ErrorKind::kInvalidArgument, fmt::format("--dtype {} on {}", flags.dtype, device),
                fmt::format("the {} backend runs {}: give auto or {}", device, native, native));
  if (!flags.quantization.empty() && flags.quantization != "fp8")
    throw Error(ErrorKind::kInvalidArgument, "--quantization " + flags.quantization,
                "Loom quantizes weights to fp8 (--quantization fp8, cuda) and loads GGUF files as they are");
  if (flags.quantization == "fp8" && device.rfind("cuda", 0) != 0)
    throw Error(ErrorKind::kInvalidArgument, "--quantization fp8 on --device " + device,
                "FP8 weights run on --device cuda (Hopper); the CPU backend runs fp32, or a GGUF file's own blocks");
  parse_kv_cache_dtype(flags.kv_cache_dtype, device);
}

KvCacheDtype parse_kv_cache_dtype(const std::string& value, const std::string& device) {
  const bool cuda = device.rfind("cuda", 0) == 0;
  if (value == "auto") return KvCacheDtype::kAuto;
  if (value == "bf16" || value == "bfloat16") {
    if (cuda) return KvCacheDtype::kAuto;
    throw Error(ErrorKind::kInvalidArgument, "--kv-cache-dtype " + value + " on --device " + device,
                "the CPU backend keeps its KV cache in float32: give auto");
  }
  if (value == "fp8" || value == "fp8_e4m3") {
    if (cuda) return KvCacheDtype::kFp8E4M3;
    throw Error(ErrorKind::kInvalidArgument, "--kv-cache-dtype " + value + " on --device " + device,
                "an FP8 KV cache runs on --device cuda (Hopper); the CPU backend keeps its KV cache in float32: give "
                "auto");
  }
  if (value == "fp8_e5m2")
    throw Error(ErrorKind::kInvalidArgument, "--kv-cache-dtype fp8_e5m2",
                "Loom's FP8 KV cache is e4m3: give fp8 (or fp8_e4m3)");
  throw Error(ErrorKind::kInvalidArgument, "--kv-cache-dtype " + value,
              "give auto (the backend's own dtype), bf16 (cuda) or fp8 / fp8_e4m3 (cuda)");
}

std::string kv_cache_dtype_label(KvCacheDtype dtype, const std::string& device) {
  if (dtype == KvCacheDtype::kFp8E4M3) return "fp8_e4m3";
  return device.rfind("cuda", 0) == 0 ? "bfloat16" : "float32";
}

std::string long_vllm_spelling(const std::string& argument) {
  if (argument == "-tp") return "--tensor-parallel-size";
  if (argument == "-q") return "--quantization";
  if (argument == "-pp") return "--pipeline-parallel-size";
  return argument;
}

std::vector<std::string> lora_specs_from_modules(const std::vector<std::string>& modules) {
  std::vector<std::string> specs;
  for (const std::string& module : modules) {
    if (module.empty() || module.front() != '{') {
      specs.push_back(module);  // NAME=PATH: parse_lora_spec checks it
      continue;
    }
    const nlohmann::json value = nlohmann::json::parse(module, nullptr, false);
    const auto text = [&](const char* key) -> std::string {
      if (!value.is_object() || !value.contains(key) || !value[key].is_string() || value[key].get<std::string>().empty())
        throw Error(ErrorKind::kInvalidArgument, "bad --lora-modules entry '" + module + "'",
                    "give NAME=PATH or {\"name\": \"NAME\", \"path\": \"PATH\"}");
      return value[key].get<std::string>();
    };
    specs.push_back(text("name") + "=" + text("path"));
  }
  return specs;
}

}  // namespace loom::cli

namespace loom::cli {

KvEventsConfig parse_kv_events_config(const std::string& json) {
  const std::string hint =
      "give vLLM's KVEventsConfig JSON, e.g. {\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", "
      "\"endpoint\": \"tcp://*:5557\", \"topic\": \"kv-events\"}";
  const nlohmann::json value = nlohmann::json::parse(json, nullptr, false);
  if (!value.is_object())
    throw Error(ErrorKind::kInvalidArgument, "--kv-events-config is not a JSON object: " + json, hint);
  const auto bad = [&](const std::string& key, const char* expected) {
    return Error(ErrorKind::kInvalidArgument, fmt::format("--kv-events-config: \"{}\" must be {}", key, expected),
                 hint);
  };
  KvEventsConfig config;
  bool enable = false;
  std::optional<std::string> publisher;
  for (const auto& [key, item] : value.items()) {
    if (key == "enable_kv_cache_events") {
      if (!item.is_boolean()) throw bad(key, "true or false");
      enable = item.get<bool>();
    } else if (key == "publisher") {
      if (!item.is_null() && !item.is_string()) throw bad(key, "\"zmq\" or \"null\"");
      if (item.is_string()) publisher = item.get<std::string>();
    } else if (key == "endpoint" || key == "topic") {
      if (!item.is_string()) throw bad(key, "a string");
      (key == "endpoint" ? config.endpoint : config.topic) = item.get<std::string>();
    } else if (key == "hwm") {
      if (!item.is_number_integer() || item.get<int64_t>() < 0 || item.get<int64_t>() > INT32_MAX)
        throw bad(key, "an integer >= 0 (0: no limit)");
      config.send_high_water_mark = item.get<int32_t>();
    } else if (key == "buffer_steps") {
      if (!item.is_number_integer() || item.get<int64_t>() < 1 || item.get<int64_t>() > INT32_MAX)
        throw bad(key, "an integer >= 1 (batches the replay socket keeps)");
      config.replay_buffer_batches = item.get<int32_t>();
    } else if (key == "max_queue_size") {
      // vLLM's publisher queue: Loom has none (it publishes on the engine thread; ZMQ's hwm bounds what waits).
      if (!item.is_number_integer()) throw bad(key, "an integer");
    } else if (key == "replay_endpoint") {
      if (!item.is_null() && !item.is_string()) throw bad(key, "a ZMQ address such as tcp://*:5558, or null");
      config.replay_endpoint = item.is_string() ? item.get<std::string>() : "";
    } else {
      throw Error(ErrorKind::kInvalidArgument, fmt::format("--kv-events-config: unknown key \"{}\"", key),
                  "the keys are vLLM's: enable_kv_cache_events, publisher, endpoint, topic, hwm, replay_endpoint, "
                  "buffer_steps, max_queue_size");
    }
  }
  const std::string chosen = publisher.value_or(enable ? "zmq" : "null");  // vLLM's default
  if (chosen != "zmq" && chosen != "null")
    throw Error(ErrorKind::kInvalidArgument, "--kv-events-config: unknown publisher \"" + chosen + "\"",
                "Loom publishes with \"zmq\" (or \"null\": none)");
  config.enabled = enable && chosen == "zmq";
  if (config.enabled && config.endpoint.empty())
    throw Error(ErrorKind::kInvalidArgument, "--kv-events-config: the endpoint is empty", hint);
  return config;
}

}  // namespace loom::cli
