#include "cli/serve_config.h"

#include <filesystem>
#include <map>

#include <fmt/format.h>

#include "chat/chat_renderer.h"
#include "kvtransfer/kv_peer_allowlist.h"
#include "util/error.h"

namespace loom::cli {
namespace {

bool on_gpu(const std::string& device) { return device.rfind("cuda", 0) == 0; }

// The base model's name in requests when --served-model-name is not given: the file or directory name
// ("SmolLM2-135M-Instruct.Q4_1" for .../SmolLM2-135M-Instruct.Q4_1.gguf).
std::string default_served_name(const std::string& model_path) {
  std::filesystem::path path(model_path);
  if (!path.has_filename()) path = path.parent_path();
  return path.extension() == ".gguf" ? path.stem().string() : path.filename().string();
}

// --generation-config: auto (the model directory's generation_config.json, if any), vllm (OpenAI's
// defaults) or a directory holding one.
server::SamplingDefaults read_sampling_defaults(const std::string& flag, const std::string& model_path) {
  if (flag == "vllm") return {};
  const std::string directory = flag == "auto" ? model_path : flag;
  if (flag != "auto" && !std::filesystem::is_directory(directory))
    throw Error(ErrorKind::kInvalidArgument, "--generation-config " + directory + ": not a directory",
                "give auto, vllm or a directory holding a generation_config.json");
  return std::filesystem::is_directory(directory) ? server::read_generation_config(directory)
                                                  : server::SamplingDefaults{};
}

// Names must say which model a request means: the base model's names and the adapters' must all differ.
void check_model_names(const std::vector<std::string>& base_names, const std::vector<LoraSpec>& adapters) {
  std::map<std::string, std::string> owner;  // name -> what it names
  auto claim = [&](const std::string& name, const std::string& what) {
    const auto [it, fresh] = owner.emplace(name, what);
    if (!fresh)
      throw Error(ErrorKind::kInvalidArgument,
                  fmt::format("the name '{}' is given twice: {} and {}", name, it->second, what),
                  "every served model name and adapter name must be distinct: requests pick a model by name");
  };
  for (const std::string& name : base_names) claim(name, "--served-model-name " + name);
  for (const LoraSpec& spec : adapters) claim(spec.name, "--lora " + spec.name + "=" + spec.path);
}

nlohmann::json kv_events_json(const KvEventsConfig& events) {
  if (!events.enabled) return nullptr;
  nlohmann::json out{{"endpoint", events.endpoint}, {"topic", events.topic}, {"hwm", events.send_high_water_mark}};
  if (!events.replay_endpoint.empty()) {
    out["replay_endpoint"] = events.replay_endpoint;
    out["buffer_steps"] = events.replay_buffer_batches;
  }
  return out;
}

}  // namespace

ResolvedServe resolve(const ServeOptions& options) {
  const VllmFlags& vllm = options.vllm;
  ResolvedServe serve;
  serve.model_path = resolve_model_path(options.model);  // random:... specs as they are

  // The engine: Loom's flags (bound to options.engine where they set a field as-is), then vLLM's spellings.
  EngineConfig& engine = serve.engine = options.engine;
  engine.block_size = options.block_size.value_or(default_block_size(options.device));
  const std::optional<KvSharing> default_sharing = parse_kv_sharing(options.default_sharing);
  if (!default_sharing)
    throw Error(ErrorKind::kInvalidArgument, "--default-sharing " + options.default_sharing,
                "use one of isolated, activated, base, forked");
  engine.default_sharing = *default_sharing;
  engine.workflow_aware_eviction = options.eviction_policy == "workflow";
  engine.blocking_host_loads = options.host_load_policy == "blocking";
  engine.swap_preemption = options.preemption_mode == "swap";
  engine.fp8_weights = vllm.quantization == "fp8";
  if (options.kv_cache_bytes) engine.kv_cache_bytes = *options.kv_cache_bytes;
  if (vllm.max_num_seqs > 0) engine.max_running_requests = vllm.max_num_seqs;
  if (vllm.max_num_batched_tokens > 0) engine.max_batch_tokens = vllm.max_num_batched_tokens;
  if (vllm.max_model_len > 0) engine.max_context_tokens = vllm.max_model_len;
  if (vllm.max_loras > 0) engine.max_loras_per_batch = vllm.max_loras;
  if (!vllm.kv_events_config.empty()) engine.kv_events = parse_kv_events_config(vllm.kv_events_config);
  // An unknown value resolves to auto here; validate() refuses it (check_vllm_flags).
  try {
    engine.kv_cache_dtype = parse_kv_cache_dtype(vllm.kv_cache_dtype, options.device);
  } catch (const Error&) {
    engine.kv_cache_dtype = KvCacheDtype::kAuto;
  }

  // The KV pool's size on a GPU: the share given, else vLLM's default unless a size is given (1 GiB held 8K
  // tokens of an 8B model).
  serve.gpu_memory_fraction =
      options.gpu_memory_fraction > 0.0 ? options.gpu_memory_fraction : vllm.gpu_memory_utilization;
  if (serve.gpu_memory_fraction == 0.0 && on_gpu(options.device) && !options.kv_cache_bytes)
    serve.gpu_memory_fraction = kDefaultGpuMemoryFraction;

  for (const std::string& spec : options.loras) serve.adapters.push_back(parse_lora_spec(spec));
  for (const std::string& spec : lora_specs_from_modules(vllm.lora_modules))
    serve.adapters.push_back(parse_lora_spec(spec));

  server::ServerConfig& server = serve.server = options.server;
  server.model_path = serve.model_path;
  if (server.served_model_names.empty()) server.served_model_names = {default_served_name(serve.model_path)};
  if (const std::optional<int64_t> seed = vllm.given_seed()) server.seed = static_cast<uint64_t>(*seed);
  server.log_requests = !vllm.disable_log_requests;
  if (!options.chat_template.empty()) server.chat_template = load_chat_template_argument(options.chat_template);
  server.sampling_defaults = read_sampling_defaults(options.generation_config, serve.model_path);

  serve.kv_transfer = options.kv_transfer;
  serve.kv_transfer.secret = read_kv_secret(options.kv_transfer.secret, options.kv_transfer.secret_file);
  serve.kv_transfer.secret_file.clear();
  KvPeerAllowlist::parse(serve.kv_transfer.peers);  // a malformed list fails before the model loads
  resolve_device_kv_plane(serve.kv_transfer.device_plane, options.device, vllm.tensor_parallel_size);  // likewise
  serve.device = DeviceOptions{options.device, options.threads, options.engine.max_adapter_slots,
                               !options.enforce_eager, cpu_precision_keeps_quantized(options.cpu_precision),
                               vllm.tensor_parallel_size, vllm.quantization == "fp8", engine.kv_cache_dtype};
  serve.device.custom_all_reduce = !vllm.disable_custom_all_reduce;
  serve.dry_run = options.dry_run;
  serve.shutdown_timeout_seconds = options.shutdown_timeout_seconds;
  serve.log_stats_interval_seconds = vllm.disable_log_stats ? 0.0 : options.log_stats_interval_seconds;
  return serve;
}

void validate(const ServeOptions& options, const ResolvedServe& serve) {
  const std::string& device = serve.device.device;
  check_vllm_flags(options.vllm, device);
  const EngineConfig& engine = serve.engine;
  if (engine.kv_cache_bytes <= 0)
    throw Error(ErrorKind::kInvalidArgument, fmt::format("--kv-cache-bytes {}", engine.kv_cache_bytes),
                "give a size above 0");
  // The host tier stages every disk read and write; a KV buffer (--role, --kv-transfer-port) brings one.
  if (!engine.disk_kv_path.empty() && engine.host_kv_cache_bytes <= 0 && !serve.kv_transfer.has_buffer())
    throw Error(ErrorKind::kInvalidArgument, "--disk-kv-path needs a host KV tier to stage its blocks",
                "add --host-kv-memory BYTES");
  // vLLM v0 refused to swap without swap space; Loom's swap space is the host tier.
  if (engine.swap_preemption && engine.host_kv_cache_bytes <= 0 && !serve.kv_transfer.has_buffer())
    throw Error(ErrorKind::kInvalidArgument, "--preemption-mode swap needs a host KV tier to swap to",
                "add --host-kv-memory BYTES");
  if (!engine.disk_kv_path.empty() && engine.disk_kv_bytes <= 0)
    throw Error(ErrorKind::kInvalidArgument, "--disk-kv-path needs its size cap", "add --disk-kv-bytes BYTES");
  if (serve.gpu_memory_fraction > 0.0 && !on_gpu(device))
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("--gpu-memory-fraction / --gpu-memory-utilization {} on --device {}",
                            serve.gpu_memory_fraction, device),
                "they size the KV pool from GPU memory; on the CPU give --kv-cache-bytes (e.g. 4G)");
  check_model_names(serve.server.served_model_names, serve.adapters);
  // A syntax error stops us before the model loads.
  if (!serve.server.chat_template.empty()) ChatRenderer checked(ModelChatTemplates{}, serve.server.chat_template);
}

int32_t check_context_limit(const EngineConfig& engine, const ModelConfig& model) {
  if (engine.max_context_tokens > model.max_position_embeddings)
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("a context of {} tokens (--max-context-tokens / --max-model-len) is above the model's "
                            "limit of {} (max_position_embeddings)",
                            engine.max_context_tokens, model.max_position_embeddings),
                "give at most the model's limit, or leave it out to use the limit");
  return engine.max_context_tokens > 0 ? engine.max_context_tokens : model.max_position_embeddings;
}

nlohmann::json effective_config(const ResolvedServe& serve, int32_t max_context_tokens) {
  const EngineConfig& engine = serve.engine;
  const server::ServerConfig& server = serve.server;
  const KvTransferOptions& kv_transfer = serve.kv_transfer;
  nlohmann::json adapters = nlohmann::json::array();
  for (const LoraSpec& spec : serve.adapters)  // mode null: the adapter's own choice
    adapters.push_back({{"name", spec.name},
                        {"path", spec.path},
                        {"mode", spec.mode.empty() ? nlohmann::json(nullptr) : nlohmann::json(spec.mode)}});
  const auto or_null = [](const std::string& text) {
    return text.empty() ? nlohmann::json(nullptr) : nlohmann::json(text);
  };
  const server::SamplingDefaults& sampling = server.sampling_defaults;
  return {{"model", server.model_path},
          {"served_model_names", server.served_model_names},
          {"device", serve.device.device},
          {"tensor_parallel_size", serve.device.tensor_parallel_size},
          {"custom_all_reduce", serve.device.custom_all_reduce},
          {"quantization", serve.device.fp8_weights ? nlohmann::json("fp8") : nlohmann::json()},
          {"kv_cache_dtype", kv_cache_dtype_label(engine.kv_cache_dtype, serve.device.device)},
          {"host", server.http.host},
          {"port", server.http.port},
          {"adapters", adapters},
          {"max_context_tokens", max_context_tokens},
          {"max_batch_tokens", engine.max_batch_tokens},
          {"max_running_requests", engine.max_running_requests},
          {"max_waiting_requests", engine.max_waiting_requests},
          {"max_loras_per_batch", engine.max_loras_per_batch},
          {"block_size", engine.block_size},
          // null: sized at start from gpu_memory_fraction (the resolved size is logged then)
          {"kv_cache_bytes", serve.gpu_memory_fraction > 0.0 ? nlohmann::json(nullptr)
                                                             : nlohmann::json(engine.kv_cache_bytes)},
          {"gpu_memory_fraction", serve.gpu_memory_fraction},
          {"host_kv_cache_bytes", engine.host_kv_cache_bytes},
          {"host_load_policy", engine.blocking_host_loads ? "blocking" : "background"},
          {"preemption_mode", engine.swap_preemption ? "swap" : "recompute"},
          {"disk_kv_path", or_null(engine.disk_kv_path)},
          {"disk_kv_bytes", engine.disk_kv_bytes},
          {"role", kv_transfer.role},
          {"kv_transfer_port", kv_transfer.port},
          {"kv_transfer_backend", kv_transfer.backend},
          {"kv_transfer_host", kv_transfer.host},
          {"kv_transfer_secret", !kv_transfer.secret.empty()},  // whether one is set, never the secret
          {"kv_transfer_peers", or_null(kv_transfer.peers)},
          {"kv_device_plane", kv_transfer.device_plane},
          {"kv_buffer_bytes", kv_transfer.has_buffer() ? nlohmann::json(kv_transfer.buffer_bytes)
                                                       : nlohmann::json(nullptr)},
          {"disk_kv_warm_start", engine.disk_kv_warm_start},
          {"disk_kv_read_bandwidth", engine.disk_kv_read_bandwidth},
          {"default_sharing", kv_sharing_name(engine.default_sharing)},
          {"eviction_policy", engine.workflow_aware_eviction ? "workflow" : "lru"},
          {"max_lora_rank", engine.max_lora_rank},
          {"seed", server.seed ? nlohmann::json(*server.seed) : nlohmann::json(nullptr)},
          {"api_key", !server.api_key.empty()},
          {"chat_template", server.chat_template.empty() ? "model" : "--chat-template"},
          {"tool_call_parser", server.tool_call_parser},
          {"reasoning_parser", server.reasoning_parser},
          {"responses_store", {{"max_entries", server.responses_store.max_entries},
                               {"max_bytes", server.responses_store.max_bytes},
                               {"ttl_seconds", server.responses_store.ttl_seconds}}},
          {"cuda_graphs", serve.device.cuda_graphs},
          {"generation_config", or_null(sampling.source)},
          {"sampling_defaults", {{"temperature", sampling.temperature},
                                 {"top_p", sampling.top_p},
                                 {"top_k", sampling.top_k},
                                 {"min_p", sampling.min_p},
                                 {"repetition_penalty", sampling.repetition_penalty}}},
          {"kv_events", kv_events_json(engine.kv_events)}};
}

}  // namespace loom::cli
