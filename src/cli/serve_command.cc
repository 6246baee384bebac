// `loom serve`: load a model and its adapters, start the engine thread and the
// OpenAI-compatible HTTP server; SIGINT/SIGTERM drain it (exit 0), a second
// signal exits at once.
#include <sys/resource.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "backend/cpu/cpu_backend.h"
#include "chat/chat_renderer.h"
#include "cli/commands.h"
#include "cli/device_backend.h"
#include "cli/kv_transfer_setup.h"
#include "cli/stop_signals.h"
#include "cli/vllm_flags.h"
#include "engine/engine.h"
#include "model/loader.h"
#include "server/http_server.h"
#include "util/error.h"

namespace loom::cli {
namespace {

// The GPU memory share the KV pool sizes itself to when no size is given (vLLM's).
constexpr double kDefaultGpuMemoryFraction = 0.9;

struct ServeOptions {
  std::string model;
  std::vector<std::string> served_model_names;  // the first is canonical
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> loras;  // NAME=PATH[:MODE]
  std::string device = "cpu";
  double gpu_memory_fraction = 0.0;
  std::string api_key;
  bool allow_runtime_lora = false;
  std::string lora_dir;
  std::string chat_template;  // --chat-template FILE|STRING
  std::string default_sharing = "isolated";
  std::string residual_kv_cache_memory = "auto";
  std::string eviction_policy = "lru";
  std::string host_kv_memory = "0";
  std::string host_residual_kv_memory = "auto";
  std::string disk_kv_bytes = "0";
  std::string disk_kv_read_bandwidth = "0";
  std::string prefetch_max_bytes = "0";
  int threads = 0;
  std::string cpu_precision = "auto";
  bool enforce_eager = false;  // cuda: no CUDA graphs
  double shutdown_timeout_seconds = 30.0;
  double log_stats_interval_seconds = 10.0;
  std::string generation_config = "auto";
  std::string kv_cache_bytes;  // --kv-cache-bytes BYTES ("" = the engine's default)
  KvTransferOptions kv_transfer;  // --role, --kv-transfer-host/-port, --kv-buffer-bytes
  bool dry_run = false;
  VllmFlags vllm;
  server::ServerConfig server;  // transport limits and flags bound directly
  server::RequestLimits request_limits;
  EngineConfig engine;
  std::optional<int32_t> block_size;  // --block-size; default_block_size(device) when not given
};

// The base model's name in requests: --served-model-name, else the file or
// directory name ("SmolLM2-135M-Instruct.Q4_1" for .../SmolLM2-135M-Instruct.Q4_1.gguf).
std::string default_served_name(const std::string& model_path) {
  std::filesystem::path path(model_path);
  if (!path.has_filename()) path = path.parent_path();
  return path.extension() == ".gguf" ? path.stem().string() : path.filename().string();
}

// Open connections are file descriptors: raise the soft limit to the hard one.
void raise_open_file_limit(int max_connections) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
    getrlimit(RLIMIT_NOFILE, &limit);
  }
  if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < static_cast<rlim_t>(max_connections) + 64)
    spdlog::warn("--max-connections {} is above what the open-file limit ({}) allows; beyond it accept() fails "
                 "and clients wait (raise `ulimit -n`)",
                 max_connections, limit.rlim_cur);
}

// Names must say which model a request means: the base model's names and the
// adapters' must all differ.
void check_model_names(const std::vector<std::string>& base_names, const std::vector<LoraSpec>& specs) {
  std::map<std::string, std::string> owner;  // name -> what it names
  auto claim = [&](const std::string& name, const std::string& what) {
    const auto [it, fresh] = owner.emplace(name, what);
    if (!fresh)
      throw Error(ErrorKind::kInvalidArgument, fmt::format("the name '{}' is given twice: {} and {}", name, it->second, what),
                  "every served model name and adapter name must be distinct: requests pick a model by name");
  };
  for (const std::string& name : base_names) claim(name, "--served-model-name " + name);
  for (const LoraSpec& spec : specs) claim(spec.name, "--lora " + spec.name + "=" + spec.path);
}

// The configuration `loom serve` runs with (printed by --dry-run and logged at start).
nlohmann::json kv_events_json(const KvEventsConfig& events) {
  if (!events.enabled) return nullptr;
  nlohmann::json out{{"endpoint", events.endpoint}, {"topic", events.topic}, {"hwm", events.send_high_water_mark}};
  if (!events.replay_endpoint.empty()) {
    out["replay_endpoint"] = events.replay_endpoint;
    out["buffer_steps"] = events.replay_buffer_batches;
  }
  return out;
}

nlohmann::json effective_config(const ServeOptions& options, const EngineConfig& engine, const server::ServerConfig& server,
                                const std::vector<LoraSpec>& specs, int32_t max_context_tokens, double gpu_fraction) {
  nlohmann::json adapters = nlohmann::json::array();
  for (const LoraSpec& spec : specs)  // mode null: the adapter's own choice
    adapters.push_back({{"name", spec.name},
                        {"path", spec.path},
                        {"mode", spec.mode.empty() ? nlohmann::json(nullptr) : nlohmann::json(spec.mode)}});
  std::vector<std::string> names = {server.served_model_name};
  names.insert(names.end(), server.served_model_aliases.begin(), server.served_model_aliases.end());
  return {{"model", server.model_path},
          {"served_model_names", names},
          {"device", options.device},
          {"host", options.host},
          {"port", options.port},
          {"adapters", adapters},
          {"max_context_tokens", max_context_tokens},
          {"max_batch_tokens", engine.max_batch_tokens},
          {"max_running_requests", engine.max_running_requests},
          {"max_waiting_requests", engine.max_waiting_requests},
          {"max_loras_per_batch", engine.max_loras_per_batch},
          {"block_size", engine.block_size},
          // null: sized at start from gpu_memory_fraction (the resolved size is logged then)
          {"kv_cache_bytes", gpu_fraction > 0.0 ? nlohmann::json(nullptr) : nlohmann::json(engine.kv_cache_bytes)},
          {"gpu_memory_fraction", gpu_fraction},
          {"host_kv_cache_bytes", engine.host_kv_cache_bytes},
          {"disk_kv_path", engine.disk_kv_path.empty() ? nlohmann::json(nullptr) : nlohmann::json(engine.disk_kv_path)},
          {"disk_kv_bytes", engine.disk_kv_bytes},
          {"role", options.kv_transfer.role},
          {"kv_transfer_port", options.kv_transfer.port},
          {"kv_transfer_backend", options.kv_transfer.backend},
          {"kv_buffer_bytes", options.kv_transfer.role == "both" && options.kv_transfer.port < 0
                                  ? nlohmann::json(nullptr)
                                  : nlohmann::json(parse_byte_size(options.kv_transfer.buffer_bytes, "--kv-buffer-bytes"))},
          {"disk_kv_warm_start", engine.disk_kv_warm_start},
          {"disk_kv_read_bandwidth", engine.disk_kv_read_bandwidth},
          {"default_sharing", kv_sharing_name(engine.default_sharing)},
          {"eviction_policy", engine.workflow_aware_eviction ? "workflow" : "lru"},
          {"max_lora_rank", engine.max_lora_rank},
          {"seed", server.seed ? nlohmann::json(*server.seed) : nlohmann::json(nullptr)},
          {"api_key", !server.api_key.empty()},
          {"chat_template", server.chat_template.empty() ? "model" : "--chat-template"},
          {"tool_call_parser", server.tool_call_parser},
          {"cuda_graphs", !options.enforce_eager},
          {"generation_config", server.sampling_defaults.source.empty() ? nlohmann::json(nullptr)
                                                                        : nlohmann::json(server.sampling_defaults.source)},
          {"sampling_defaults", {{"temperature", server.sampling_defaults.temperature},
                                 {"top_p", server.sampling_defaults.top_p},
                                 {"top_k", server.sampling_defaults.top_k},
                                 {"min_p", server.sampling_defaults.min_p},
                                 {"repetition_penalty", server.sampling_defaults.repetition_penalty}}},
          {"kv_events", kv_events_json(engine.kv_events)}};
}

int run_serve(const ServeOptions& options) {
  install_stop_signals();  // before anything: a signal during loading waits in the pipe (then drains at once)
  check_vllm_flags(options.vllm, options.device);

  EngineConfig engine_config = options.engine;
  engine_config.block_size = options.block_size.value_or(default_block_size(options.device));
  const std::optional<KvSharing> default_sharing = parse_kv_sharing(options.default_sharing);
  if (!default_sharing)
    throw Error(ErrorKind::kInvalidArgument, "--default-sharing " + options.default_sharing,
                "use one of isolated, activated, base, forked");
  engine_config.default_sharing = *default_sharing;
  engine_config.workflow_aware_eviction = options.eviction_policy == "workflow";
  if (!options.kv_cache_bytes.empty()) {
    engine_config.kv_cache_bytes = parse_byte_size(options.kv_cache_bytes, "--kv-cache-bytes");
    if (engine_config.kv_cache_bytes <= 0)
      throw Error(ErrorKind::kInvalidArgument, "--kv-cache-bytes " + options.kv_cache_bytes, "give a size above 0");
  }
  engine_config.host_kv_cache_bytes = parse_byte_size(options.host_kv_memory, "--host-kv-memory");
  engine_config.host_residual_kv_cache_bytes =
      options.host_residual_kv_memory == "auto"
          ? -1
          : parse_byte_size(options.host_residual_kv_memory, "--host-residual-kv-memory");
  engine_config.prefetch_max_bytes = parse_byte_size(options.prefetch_max_bytes, "--prefetch-max-bytes");
  engine_config.disk_kv_bytes = parse_byte_size(options.disk_kv_bytes, "--disk-kv-bytes");
  engine_config.disk_kv_read_bandwidth = parse_byte_size(options.disk_kv_read_bandwidth, "--disk-kv-read-bandwidth");
  const bool has_kv_buffer = options.kv_transfer.role != "both" || options.kv_transfer.port >= 0;  // gets a host tier
  if (!engine_config.disk_kv_path.empty() && engine_config.host_kv_cache_bytes <= 0 && !has_kv_buffer)
    throw Error(ErrorKind::kInvalidArgument, "--disk-kv-path needs a host KV tier to stage its blocks",
                "add --host-kv-memory BYTES");
  if (!engine_config.disk_kv_path.empty() && engine_config.disk_kv_bytes <= 0)
    throw Error(ErrorKind::kInvalidArgument, "--disk-kv-path needs its size cap", "add --disk-kv-bytes BYTES");
  engine_config.residual_kv_cache_bytes =
      options.residual_kv_cache_memory == "auto" ? -1
                                                 : parse_byte_size(options.residual_kv_cache_memory,
                                                                   "--residual-kv-cache-memory");
  // vLLM's spellings (vllm_flags.h) set the same fields as Loom's.
  const VllmFlags& vllm = options.vllm;
  if (vllm.max_num_seqs > 0) engine_config.max_running_requests = vllm.max_num_seqs;
  if (vllm.max_num_batched_tokens > 0) engine_config.max_batch_tokens = vllm.max_num_batched_tokens;
  if (vllm.max_model_len > 0) engine_config.max_context_tokens = vllm.max_model_len;
  if (vllm.max_loras > 0) engine_config.max_loras_per_batch = vllm.max_loras;
  if (!vllm.kv_events_config.empty()) engine_config.kv_events = parse_kv_events_config(vllm.kv_events_config);
  double gpu_fraction = options.gpu_memory_fraction > 0.0 ? options.gpu_memory_fraction
                                                          : vllm.gpu_memory_utilization;
  const bool on_gpu = options.device.rfind("cuda", 0) == 0;
  if (gpu_fraction > 0.0 && !on_gpu)
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("--gpu-memory-fraction / --gpu-memory-utilization {} on --device {}", gpu_fraction,
                            options.device),
                "they size the KV pool from GPU memory; on the CPU give --kv-cache-bytes (e.g. 4G)");
  // vLLM's default on a GPU: the pool takes what 90% of the card leaves after
  // the weights, unless a size is given (1 GiB held 8K tokens of an 8B model).
  if (gpu_fraction == 0.0 && on_gpu && options.kv_cache_bytes.empty()) gpu_fraction = kDefaultGpuMemoryFraction;
  std::vector<LoraSpec> specs;
  for (const auto& spec_text : options.loras) specs.push_back(parse_lora_spec(spec_text));  // bad flags fail early
  for (const auto& spec_text : lora_specs_from_modules(vllm.lora_modules)) specs.push_back(parse_lora_spec(spec_text));
  std::string chat_template;
  if (!options.chat_template.empty()) {
    chat_template = load_chat_template_argument(options.chat_template);
    ChatRenderer checked(ModelChatTemplates{}, chat_template);  // a syntax error stops us before the model loads
  }

  const bool is_random_model = options.model.rfind("random:", 0) == 0;
  const std::string model_path = is_random_model ? options.model : resolve_model_path(options.model);

  server::ServerConfig config = options.server;
  config.http.host = options.host;
  config.http.port = options.port;
  config.api_key = options.api_key;
  config.model_path = options.model.empty() ? model_path : options.model;
  config.served_model_name =
      options.served_model_names.empty() ? default_served_name(model_path) : options.served_model_names[0];
  if (options.served_model_names.size() > 1)
    config.served_model_aliases.assign(options.served_model_names.begin() + 1, options.served_model_names.end());
  if (const std::optional<int64_t> seed = vllm.given_seed()) config.seed = static_cast<uint64_t>(*seed);
  config.allow_runtime_lora = options.allow_runtime_lora;
  config.lora_dir = options.lora_dir;
  config.request_limits = options.request_limits;
  config.chat_template = chat_template;
  config.log_requests = !vllm.disable_log_requests;
  if (options.generation_config != "vllm") {
    const std::string directory = options.generation_config == "auto" ? model_path : options.generation_config;
    if (options.generation_config != "auto" && !std::filesystem::is_directory(directory))
      throw Error(ErrorKind::kInvalidArgument, "--generation-config " + directory + ": not a directory",
                  "give auto, vllm or a directory holding a generation_config.json");
    if (std::filesystem::is_directory(directory)) config.sampling_defaults = server::read_generation_config(directory);
    const server::SamplingDefaults& d = config.sampling_defaults;
    if (!d.source.empty() && !(d == server::SamplingDefaults{.source = d.source}))
      spdlog::info("sampling defaults from {} (requests that omit them): temperature {}, top_p {}, top_k {}, min_p {}, "
                   "repetition_penalty {}; --generation-config vllm uses OpenAI's",
                   d.source, d.temperature, d.top_p, d.top_k, d.min_p, d.repetition_penalty);
  }
  std::vector<std::string> base_names = {config.served_model_name};
  base_names.insert(base_names.end(), config.served_model_aliases.begin(), config.served_model_aliases.end());
  check_model_names(base_names, specs);

  const DeviceOptions device_options{options.device, options.threads, options.engine.max_adapter_slots,
                                     !options.enforce_eager, cpu_precision_keeps_quantized(options.cpu_precision)};
  // --dry-run needs only the model's config: no backend, no engine.
  std::optional<ModelOnDevice> loaded;
  std::optional<LoadedModel> described;
  if (options.dry_run) {
    described = load_model_description(model_path);
  } else {
    loaded = load_model_on_device(model_path, device_options);
  }
  const ModelConfig& model_config = options.dry_run ? described->config : loaded->model.config;
  if (engine_config.max_context_tokens > model_config.max_position_embeddings)
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("a context of {} tokens (--max-context-tokens / --max-model-len) is above the model's "
                            "limit of {} (max_position_embeddings)",
                            engine_config.max_context_tokens, model_config.max_position_embeddings),
                "give at most the model's limit, or leave it out to use the limit");
  const int32_t max_context_tokens = engine_config.max_context_tokens > 0 ? engine_config.max_context_tokens
                                                                          : model_config.max_position_embeddings;
  const nlohmann::json effective =
      effective_config(options, engine_config, config, specs, max_context_tokens, gpu_fraction);
  if (options.dry_run) {
    std::printf("%s\n", effective.dump(2).c_str());
    return 0;
  }
  spdlog::info("config: {}", effective.dump());
  if (gpu_fraction > 0.0) {
    engine_config.kv_cache_bytes = kv_cache_bytes_for_gpu_fraction(device_options, gpu_fraction);
    const int64_t per_token = loaded->backend->kv_bytes_per_token();
    spdlog::info("KV pool: {:.2f} GiB, {} tokens ({} of the GPU less the weights)",
                 static_cast<double>(engine_config.kv_cache_bytes) / (1 << 30),
                 per_token > 0 ? engine_config.kv_cache_bytes / per_token : 0, gpu_fraction);
  }
  config.kv_transfer = prepare_kv_transfer(options.kv_transfer, engine_config, loaded->backend->kv_bytes_per_token());
  std::unique_ptr<Engine> engine = make_engine(std::move(loaded->model), std::move(loaded->backend), engine_config);
  // Loaded before any request: forked adapters here size the rCache pool.
  for (const LoraSpec& spec : specs) engine->load_adapter(spec.name, spec.path, spec.sharing);
  for (const AdapterInfo& adapter : engine->adapters())
    spdlog::info("adapter '{}' from {} (rank {}, kv_sharing {})", adapter.name, adapter.path, adapter.rank,
                 kv_sharing_name(adapter.sharing));
  start_kv_link(options.kv_transfer, options.host, options.device, *engine, config.kv_transfer);
  // The link asks the engine what it caches: it stops before the engine is destroyed, on every way out.
  struct StopKvLinkFirst {
    server::KvTransferSetup& setup;
    ~StopKvLinkFirst() {
      setup.link.reset();
      setup.client.reset();
    }
  } stop_kv_link_first{config.kv_transfer};
  raise_open_file_limit(config.http.max_connections);
  server::HttpServer server(*engine, config);
  server.bind();

  const auto shutdown_timeout = std::chrono::milliseconds(static_cast<int64_t>(options.shutdown_timeout_seconds * 1e3));
  StopSignalWatcher signal_watcher([&](int signal_number) {
    spdlog::info("signal {}: draining (new connections refused; requests in flight get up to {} s; a second "
                 "signal exits at once)",
                 signal_number, options.shutdown_timeout_seconds);
    const bool drained = server.shutdown(shutdown_timeout);
    spdlog::info(drained ? "every request in flight finished" : "requests still running were ended with an error");
  });
  spdlog::info("serving '{}' on http://{}:{} (max context {} tokens)", config.served_model_name, config.http.host,
               server.bound_port(), engine->max_context_tokens());
  const double stats_interval = vllm.disable_log_stats ? 0.0 : options.log_stats_interval_seconds;
  std::mutex stats_mutex;
  std::condition_variable stats_stop;
  bool serving_ended = false;
  std::thread stats_logger([&] {
    if (stats_interval <= 0) return;
    const auto interval = std::chrono::duration<double>(stats_interval);
    std::unique_lock lock(stats_mutex);
    auto last = std::chrono::steady_clock::now();
    while (!stats_stop.wait_for(lock, interval, [&] { return serving_ended; })) {
      const auto now = std::chrono::steady_clock::now();
      if (std::optional<std::string> line = server.stats_line(std::chrono::duration<double>(now - last).count()))
        spdlog::info("{}", *line);
      last = now;
    }
  });
  server.run();
  {
    std::lock_guard lock(stats_mutex);
    serving_ended = true;
  }
  stats_stop.notify_all();
  stats_logger.join();
  server.stop();
  engine->shutdown(false);  // cancels what is left and frees every KV block
  signal_watcher.finish();
  spdlog::info("stopped");
  return 0;
}

}  // namespace

CommandRunner register_serve(CLI::App& app) {
  auto options = std::make_shared<ServeOptions>();
  EngineConfig& engine = options->engine;
  app.add_option("--model", options->model, "Hugging Face directory or .gguf file (default: built-in SmolLM2-135M)");
  app.add_option("--served-model-name", options->served_model_names,
                 "Base model names in requests, one or more (the first is the one responses carry; default: the "
                 "file name)");
  app.add_option("--host", options->host, "Address to bind (default 127.0.0.1)");
  app.add_option("--port", options->port, "Port (default 8000; 0 = any free port)")->check(CLI::Range(0, 65535));
  app.add_option("--lora", options->loras, "Adapter NAME=PATH[:MODE] (repeatable)");
  app.add_option("--device", options->device, "cpu, cuda or cuda:N (builds with the CUDA backend)");
  app.add_option("--gpu-memory-fraction", options->gpu_memory_fraction,
                 "cuda: size the KV pool so that this fraction of GPU memory is used (overrides --kv-cache-bytes)");
  app.add_option("--api-key", options->api_key, "Require Authorization: Bearer KEY on /v1/*");
  app.add_flag("--allow-runtime-lora", options->allow_runtime_lora,
               "Enable POST /v1/load_lora_adapter and /v1/unload_lora_adapter");
  app.add_option("--lora-dir", options->lora_dir, "Runtime adapters must lie under this directory");
  app.add_option("--tool-call-parser", options->server.tool_call_parser,
                 "How chat outputs are read for tool calls (tool_choice auto): auto (from the chat template), "
                 "hermes, llama3_json, mistral, none")
      ->check(CLI::IsMember({"auto", "none", "hermes", "llama3_json", "mistral"}));
  app.add_option("--chat-template", options->chat_template,
                 "Jinja chat template replacing the model's: a file, or the template text (as vLLM's); checked at "
                 "start-up");
  server::TransportConfig& http = options->server.http;
  app.add_flag("--metrics-require-api-key", options->server.metrics_require_api_key,
               "Also require the --api-key on GET /metrics");
  app.add_option("--max-request-bytes", http.max_request_bytes,
                 "Larger request bodies get 413, whatever the transfer encoding (suffix K, M, G allowed)")
      ->transform(byte_size_transform())->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--max-header-bytes", http.max_header_bytes, "Larger request line + headers get 431")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--max-header-count", http.max_header_count, "More request header lines get 431")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--header-timeout", http.header_timeout_seconds,
                 "Seconds from a request's first byte to the end of its headers; then 408")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--body-timeout", http.body_timeout_seconds,
                 "Seconds from the end of the headers to the end of the body; then 408")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--keep-alive-timeout", http.keep_alive_timeout_seconds,
                 "Seconds an idle connection stays open between requests")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--write-timeout", http.write_timeout_seconds,
                 "Seconds one write of a response may wait for a client that does not read; then it is dropped")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--max-connections", http.max_connections, "Open connections at most; beyond, 503 and close")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--generation-config", options->generation_config,
                 "Sampling defaults for requests that omit them (temperature, top_p, top_k, min_p, "
                 "repetition_penalty), as vLLM: auto = the model directory's generation_config.json, vllm = "
                 "OpenAI's defaults, or a directory holding a generation_config.json")
      ->capture_default_str();
  app.add_option("--log-stats-interval", options->log_stats_interval_seconds,
                 "Seconds between stats lines in the log (throughput, running / waiting requests, KV cache usage "
                 "per tier, prefix-cache hit rate), as vLLM logs them; only while the server has work; 0 = none "
                 "(vLLM's --disable-log-stats)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--shutdown-timeout", options->shutdown_timeout_seconds,
                 "On SIGINT/SIGTERM: seconds requests in flight may take to finish before they are ended with an "
                 "error")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  server::RequestLimits& limits = options->request_limits;
  app.add_option("--max-n", limits.max_n, "Largest `n` (choices per prompt) a request may ask for")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--max-stop-strings", limits.max_stop_strings, "Most entries in a request's `stop`")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--max-stop-string-bytes", limits.max_stop_string_bytes, "Longest stop string, in bytes")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--max-request-output-tokens", limits.max_request_output_tokens,
                 "Most output tokens one request may ask for: prompts x n x max_tokens")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--max-batch-tokens", engine.max_batch_tokens, "Tokens per forward step")->check(CLI::PositiveNumber);
  app.add_option("--max-running-requests", engine.max_running_requests, "Requests in the running batch at most")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-waiting-requests", engine.max_waiting_requests, "Queued requests beyond this get 503")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-loras-per-batch", engine.max_loras_per_batch, "Distinct adapters in one batch at most")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-context-tokens", engine.max_context_tokens, "Prompt + output limit (0 = the model's)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--block-size", options->block_size, "KV block size in tokens (default: 4 on cpu, 16 on cuda)")
      ->check(CLI::PositiveNumber);
  app.add_option("--kv-cache-bytes", options->kv_cache_bytes,
                 "KV cache pool size: BYTES (suffix K, M, G allowed; rCache included; default 1G on the CPU, "
                 "--gpu-memory-fraction 0.9 on a GPU)");
  app.add_option("--default-sharing", options->default_sharing,
                 "KV sharing of adapters that choose none: isolated (default), base, forked (activated only for "
                 "aLoRA adapters, which get it anyway)")
      ->check(CLI::IsMember({"isolated", "activated", "base", "forked"}));
  add_disable_kv_sharing_option(app, engine.disabled_kv_sharing);
  app.add_option("--residual-kv-cache-memory", options->residual_kv_cache_memory,
                 "Forked adapters' rCache pool, taken out of --kv-cache-bytes: BYTES (suffix K, M, G allowed), 0 = "
                 "none, auto (default) = 1/8 of the KV cache when a forked adapter is loaded at start");
  app.add_option("--max-lora-rank", engine.max_lora_rank,
                 "Largest k/v LoRA rank of a forked adapter (0 = the largest loaded at start, at least 16)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--eviction-policy", options->eviction_policy,
                 "Which cached KV blocks go first: lru (default) or workflow (KVFlow: dynamic suffixes, then agents' "
                 "fixed prefixes by steps-to-execution, furthest first; see PUT /v1/workflows/{id})")
      ->check(CLI::IsMember({"lru", "workflow"}));
  app.add_option("--host-kv-memory", options->host_kv_memory,
                 "Host-memory tier of the KV cache: BYTES (suffix K, M, G allowed; 0 = none, the default). Cached "
                 "blocks are backed up there and evicted blocks load back instead of being recomputed. Shared with "
                 "the forked adapters' rCache pool when there is one (see --host-residual-kv-memory)");
  app.add_option("--host-residual-kv-memory", options->host_residual_kv_memory,
                 "The forked rCache pool's part of --host-kv-memory: BYTES (suffix K, M, G allowed), 0 = no host "
                 "tier for the rCache, auto (default) = its share of the device KV bytes (each pool's host tier "
                 "then holds the same multiple of its device pool)");
  app.add_option("--disk-kv-path", engine.disk_kv_path,
                 "Disk / shared-storage tier of the KV cache below the host tier: a directory of content-addressed "
                 "block files (created if missing) that several servers may share, on a local disk or NFS / CephFS "
                 "/ 3FS. Needs --host-kv-memory and --disk-kv-bytes. Blocks are written through when backed up to "
                 "the host and read back disk -> host -> device");
  app.add_option("--disk-kv-bytes", options->disk_kv_bytes,
                 "Cap on the --disk-kv-path directory's block files, across every server using it: BYTES (suffix "
                 "K, M, G allowed); the least recently used files go first");
  app.add_flag("--disk-kv-warm-start", engine.disk_kv_warm_start,
               "Index the blocks already in --disk-kv-path at start (a restart is warm at once; without it blocks "
               "there are still found one lookup at a time)");
  app.add_option("--disk-kv-read-bandwidth", options->disk_kv_read_bandwidth,
                 "Pace disk-tier reads to BYTES per second (suffix K, M, G allowed; 0 = unpaced): emulates a slower "
                 "network store on one machine");
  app.add_option("--role", options->kv_transfer.role,
                 "Prefill/decode disaggregation behind `loom router`: prefill, decode or both. prefill and decode "
                 "engines get a KV buffer (--kv-buffer-bytes, over --disk-kv-path when given) and a KV link on "
                 "--kv-transfer-port; the router tells them about each other")
      ->check(CLI::IsMember({"prefill", "decode", "both"}));
  app.add_option("--kv-transfer-port", options->kv_transfer.port,
                 "Port of the KV link other engines push blocks to (0 = a free one, the default for prefill / "
                 "decode; -1 = none; /loom/kv/status reports it)")
      ->check(CLI::Range(-1, 65535));
  app.add_option("--kv-transfer-host", options->kv_transfer.host, "Address the KV link listens on (default: --host)");
  app.add_option("--kv-transfer-backend", options->kv_transfer.backend,
                 "How the KV link moves block payloads: tcp (inline on its TCP connection), nccl (GPU to GPU "
                 "through NCCL between --device cuda:N engines; NCCL is loaded at run time, LOOM_NCCL_LIBRARY names "
                 "libnccl.so.2 when the loader cannot find it) or auto (nccl on a CUDA device when NCCL loads, else "
                 "tcp). A peer without the same plane gets payloads inline")
      ->check(CLI::IsMember({"auto", "tcp", "nccl"}))
      ->capture_default_str();
  app.add_option("--kv-buffer-bytes", options->kv_transfer.buffer_bytes,
                 "Memory for KV blocks moving between engines (DualPath's engine buffer): BYTES, suffix K, M, G");
  app.add_option("--prefetch-agents", engine.prefetch_agents,
                 "With a host tier: load back the fixed prefixes of this many agents closest to running, from the "
                 "workflow graphs (0 = no prefetch; default 2)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--prefetch-max-bytes", options->prefetch_max_bytes,
                 "With a host tier: KV bytes one step may start prefetching (0 = no limit but the pool)");
  app.add_option("--workflow-ttl-seconds", engine.workflow_ttl_seconds,
                 "Workflows without a request or API call for this long are forgotten (default 600)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-workflows", engine.max_workflows,
                 "Workflows known at once; a new one beyond gets 503 (requests naming one are served untracked)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--max-workflow-agents", engine.max_workflow_agents,
                 "Agents in one workflow graph (declared or named in `after`) and entries per progress list")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--threads", options->threads, "CPU threads (0 = all cores)");
  app.add_option("--cpu-precision", options->cpu_precision, kCpuPrecisionHelp)
      ->check(CLI::IsMember({"auto", "fp32"}))
      ->capture_default_str();
  app.add_flag("--enforce-eager", options->enforce_eager,
               "cuda: run every step eagerly (default: decode steps replay CUDA graphs captured per batch shape)");
  app.add_option("--http-threads", http.num_handler_threads,
                 "Requests handled at once (a streaming or waiting request holds one; idle connections none)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_flag("--dry-run", options->dry_run,
               "Check the flags and the model's config, print the effective configuration as JSON and exit");
  add_vllm_flags(app, options->vllm);
  return [options] { return run_serve(*options); };
}

}  // namespace loom::cli
