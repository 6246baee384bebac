// `loom serve`: load a model and its adapters, start the engine thread and the
// OpenAI-compatible HTTP server; SIGINT/SIGTERM stop it gracefully (exit 0).
#include <csignal>
#include <filesystem>
#include <thread>

#include <pthread.h>
#include <spdlog/spdlog.h>

#include "backend/cpu/cpu_backend.h"
#include "cli/commands.h"
#include "cli/device_backend.h"
#include "engine/engine.h"
#include "model/loader.h"
#include "server/http_server.h"
#include "util/error.h"

namespace loom::cli {
namespace {

struct ServeOptions {
  std::string model;
  std::string served_model_name;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> loras;  // NAME=PATH[:MODE]
  std::string device = "cpu";
  double gpu_memory_fraction = 0.0;
  std::string api_key;
  bool allow_runtime_lora = false;
  std::string lora_dir;
  std::string default_sharing = "isolated";
  std::string residual_kv_cache_memory = "auto";
  std::string eviction_policy = "lru";
  std::string host_kv_memory = "0";
  std::string prefetch_max_bytes = "0";
  size_t max_request_bytes = 8u << 20;
  int threads = 0;
  int http_threads = 128;
  server::RequestLimits request_limits;
  EngineConfig engine;
};

// The base model's name in requests: --served-model-name, else the file or
// directory name ("SmolLM2-135M-Instruct.Q4_1" for .../SmolLM2-135M-Instruct.Q4_1.gguf).
std::string default_served_name(const std::string& model_path) {
  std::filesystem::path path(model_path);
  if (!path.has_filename()) path = path.parent_path();
  return path.extension() == ".gguf" ? path.stem().string() : path.filename().string();
}

int run_serve(const ServeOptions& options) {
  // Signals go to the watcher thread only: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a vanished client is a failed write, not a crash

  EngineConfig engine_config = options.engine;
  const std::optional<KvSharing> default_sharing = parse_kv_sharing(options.default_sharing);
  if (!default_sharing)
    throw Error(ErrorKind::kInvalidArgument, "--default-sharing " + options.default_sharing,
                "use one of isolated, activated, base, forked");
  engine_config.default_sharing = *default_sharing;
  engine_config.workflow_aware_eviction = options.eviction_policy == "workflow";
  engine_config.host_kv_cache_bytes = parse_byte_size(options.host_kv_memory, "--host-kv-memory");
  engine_config.prefetch_max_bytes = parse_byte_size(options.prefetch_max_bytes, "--prefetch-max-bytes");
  engine_config.residual_kv_cache_bytes =
      options.residual_kv_cache_memory == "auto" ? -1
                                                 : parse_byte_size(options.residual_kv_cache_memory,
                                                                   "--residual-kv-cache-memory");
  std::vector<LoraSpec> specs;
  for (const auto& spec_text : options.loras) specs.push_back(parse_lora_spec(spec_text));  // bad flags fail early

  const bool is_random_model = options.model.rfind("random:", 0) == 0;
  const std::string model_path = is_random_model ? options.model : resolve_model_path(options.model);
  const DeviceOptions device_options{options.device, options.threads, options.engine.max_adapter_slots};
  ModelOnDevice loaded = load_model_on_device(model_path, device_options);
  if (options.gpu_memory_fraction > 0.0)
    engine_config.kv_cache_bytes = kv_cache_bytes_for_gpu_fraction(device_options, options.gpu_memory_fraction);
  std::unique_ptr<Engine> engine = make_engine(std::move(loaded.model), std::move(loaded.backend), engine_config);
  // Loaded before any request: forked adapters here size the rCache pool.
  for (const LoraSpec& spec : specs) engine->load_adapter(spec.name, spec.path, spec.sharing);
  for (const AdapterInfo& adapter : engine->adapters())
    spdlog::info("adapter '{}' from {} (rank {}, kv_sharing {})", adapter.name, adapter.path, adapter.rank,
                 kv_sharing_name(adapter.sharing));

  server::ServerConfig config;
  config.host = options.host;
  config.port = options.port;
  config.api_key = options.api_key;
  config.model_path = options.model.empty() ? model_path : options.model;
  config.served_model_name =
      options.served_model_name.empty() ? default_served_name(model_path) : options.served_model_name;
  config.allow_runtime_lora = options.allow_runtime_lora;
  config.lora_dir = options.lora_dir;
  config.max_request_bytes = options.max_request_bytes;
  config.num_http_threads = options.http_threads;
  config.request_limits = options.request_limits;
  server::HttpServer server(*engine, config);
  server.bind();

  std::thread signal_watcher([&] {
    int signal_number = 0;
    sigwait(&signals, &signal_number);
    if (signal_number == 0) return;  // woken by ourselves at normal exit
    spdlog::info("signal {}: stopping (in-flight requests are cancelled)", signal_number);
    server.stop();
    engine->shutdown(false);
  });
  spdlog::info("serving '{}' on http://{}:{} (max context {} tokens)", config.served_model_name, config.host,
               server.bound_port(), engine->max_context_tokens());
  server.run();
  server.stop();
  engine->shutdown(false);
  pthread_kill(signal_watcher.native_handle(), SIGTERM);  // no-op if it already returned
  signal_watcher.join();
  spdlog::info("stopped");
  return 0;
}

}  // namespace

CommandRunner register_serve(CLI::App& app) {
  auto options = std::make_shared<ServeOptions>();
  EngineConfig& engine = options->engine;
  app.add_option("--model", options->model, "Hugging Face directory or .gguf file (default: built-in SmolLM2-135M)");
  app.add_option("--served-model-name", options->served_model_name, "Base model name in requests (default: file name)");
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
  app.add_option("--max-request-bytes", options->max_request_bytes, "Larger request bodies get 413")
      ->check(CLI::PositiveNumber);
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
  app.add_option("--block-size", engine.block_size, "KV block size in tokens")->check(CLI::PositiveNumber);
  app.add_option("--kv-cache-bytes", engine.kv_cache_bytes, "KV cache pool size in bytes (rCache included)")
      ->check(CLI::PositiveNumber);
  app.add_option("--default-sharing", options->default_sharing,
                 "KV sharing of adapters that choose none: isolated (default), base, forked (activated only for "
                 "aLoRA adapters, which get it anyway)")
      ->check(CLI::IsMember({"isolated", "activated", "base", "forked"}));
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
                 "blocks are backed up there and evicted blocks load back instead of being recomputed");
  app.add_option("--prefetch-agents", engine.prefetch_agents,
                 "With a host tier: load back the fixed prefixes of this many agents closest to running, from the "
                 "workflow graphs (0 = no prefetch; default 2)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--prefetch-max-bytes", options->prefetch_max_bytes,
                 "With a host tier: KV bytes one step may start prefetching (0 = no limit but the pool)");
  app.add_option("--workflow-ttl-seconds", engine.workflow_ttl_seconds,
                 "Workflows without a request or API call for this long are forgotten (default 600)")
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", options->threads, "CPU threads (0 = all cores)");
  app.add_option("--http-threads", options->http_threads, "HTTP worker threads (one per open connection)")
      ->check(CLI::PositiveNumber);
  return [options] { return run_serve(*options); };
}

}  // namespace loom::cli
