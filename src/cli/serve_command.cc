// `loom serve`: load a model and its adapters, start the engine thread and the
// OpenAI-compatible HTTP server; SIGINT/SIGTERM drain it (exit 0), a second
// signal exits at once. The flags and what they resolve to: serve_config.h.
#include <sys/resource.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "cli/device_backend.h"
#include "cli/kv_transfer_setup.h"
#include "cli/serve_config.h"
#include "cli/stop_signals.h"
#include "engine/engine.h"
#include "model/loader.h"
#include "model/tensor_parallel.h"
#include "server/http_server.h"

namespace loom::cli {
namespace {

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

void log_sampling_defaults(const server::SamplingDefaults& d) {
  if (!d.source.empty() && !(d == server::SamplingDefaults{.source = d.source}))
    spdlog::info("sampling defaults from {} (requests that omit them): temperature {}, top_p {}, top_k {}, min_p {}, "
                 "repetition_penalty {}; --generation-config vllm uses OpenAI's",
                 d.source, d.temperature, d.top_p, d.top_k, d.min_p, d.repetition_penalty);
}

// vLLM's periodic stats line (HttpServer::stats_line) every `interval_seconds` until stop(); none for 0.
class StatsLogger {
 public:
  StatsLogger(server::HttpServer& server, double interval_seconds)
      : thread_([this, &server, interval_seconds] { run(server, interval_seconds); }) {}
  ~StatsLogger() { stop(); }
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopped_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run(server::HttpServer& server, double interval_seconds) {
    if (interval_seconds <= 0) return;
    const auto interval = std::chrono::duration<double>(interval_seconds);
    std::unique_lock lock(mutex_);
    auto last = std::chrono::steady_clock::now();
    while (!wake_.wait_for(lock, interval, [&] { return stopped_; })) {
      const auto now = std::chrono::steady_clock::now();
      if (std::optional<std::string> line = server.stats_line(std::chrono::duration<double>(now - last).count()))
        spdlog::info("{}", *line);
      last = now;
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopped_ = false;
  std::thread thread_;  // last: it starts once the rest is built
};

int run_serve(const ServeOptions& options) {
  install_stop_signals();  // before anything: a signal during loading waits in the pipe (then drains at once)
  ResolvedServe serve = resolve(options);
  validate(options, serve);
  log_sampling_defaults(serve.server.sampling_defaults);

  // --dry-run needs only the model's config: no backend, no engine.
  if (serve.dry_run) {
    const LoadedModel described = load_model_description(serve.model_path);
    check_tensor_parallel_size(described.config, serve.device.tensor_parallel_size);
    std::printf("%s\n", effective_config(serve, check_context_limit(serve.engine, described.config)).dump(2).c_str());
    return 0;
  }
  ModelOnDevice loaded = load_model_on_device(serve.model_path, serve.device);
  spdlog::info("config: {}", effective_config(serve, check_context_limit(serve.engine, loaded.model.config)).dump());
  EngineConfig& engine_config = serve.engine;
  server::ServerConfig& config = serve.server;
  if (serve.gpu_memory_fraction > 0.0) {
    engine_config.kv_cache_bytes = kv_cache_bytes_for_gpu_fraction(serve.device, serve.gpu_memory_fraction);
    const int64_t per_token = loaded.backend->kv_bytes_per_token();
    spdlog::info("KV pool: {:.2f} GiB, {} tokens ({} of the GPU less the weights)",
                 static_cast<double>(engine_config.kv_cache_bytes) / (1 << 30),
                 per_token > 0 ? engine_config.kv_cache_bytes / per_token : 0, serve.gpu_memory_fraction);
  }
  config.kv_transfer = prepare_kv_transfer(serve.kv_transfer, engine_config, loaded.backend->kv_bytes_per_token(),
                                           serve.device.device, serve.device.tensor_parallel_size);
  std::unique_ptr<Engine> engine = make_engine(std::move(loaded.model), std::move(loaded.backend), engine_config);
  // Loaded before any request: forked adapters here size the rCache pool.
  for (const LoraSpec& spec : serve.adapters) engine->load_adapter(spec.name, spec.path, spec.sharing);
  for (const AdapterInfo& adapter : engine->adapters())
    spdlog::info("adapter '{}' from {} (rank {}, kv_sharing {})", adapter.name, adapter.path, adapter.rank,
                 kv_sharing_name(adapter.sharing));
  start_kv_link(serve.kv_transfer, serve.device.device, *engine, config.kv_transfer);
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

  const double shutdown_timeout = serve.shutdown_timeout_seconds;
  StopSignalWatcher signal_watcher([&](int signal_number) {
    spdlog::info("signal {}: draining (new connections refused; requests in flight get up to {} s; a second "
                 "signal exits at once)",
                 signal_number, shutdown_timeout);
    const bool drained = server.shutdown(std::chrono::milliseconds(static_cast<int64_t>(shutdown_timeout * 1e3)));
    spdlog::info(drained ? "every request in flight finished" : "requests still running were ended with an error");
  });
  spdlog::info("serving '{}' on http://{}:{} (max context {} tokens)", config.served_model_name(), config.http.host,
               server.bound_port(), engine->max_context_tokens());
  StatsLogger stats(server, serve.log_stats_interval_seconds);
  server.run();
  stats.stop();
  server.stop();
  engine->shutdown(false);  // cancels what is left and frees every KV block
  signal_watcher.finish();
  spdlog::info("stopped");
  return 0;
}

}  // namespace

CommandRunner register_serve(CLI::App& app) {
  auto options = std::make_shared<ServeOptions>();
  add_serve_flags(app, *options);
  return [options] { return run_serve(*options); };
}

}  // namespace loom::cli
