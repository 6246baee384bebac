// `loom router`: the global scheduler in front of `loom serve --role prefill`
// and `--role decode` engines (DualPath; router/router_server.h).
// SIGINT/SIGTERM drain it (exit 0); a second signal exits at once.

#include <memory>

#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "cli/kv_transfer_setup.h"
#include "cli/stop_signals.h"
#include "router/router_server.h"
#include "util/error.h"

namespace loom::cli {
namespace {

struct RouterOptions {
  router::RouterConfig config;
  std::string kv_secret, kv_secret_file;  // --kv-transfer-secret(-file)
  std::string path_policy = "dual";
  double engine_timeout_seconds = 30.0;
  double shutdown_timeout_seconds = 30.0;
};

int run_router(RouterOptions& options) {
  install_stop_signals();
  router::RouterConfig& config = options.config;
  std::optional<router::PathPolicy> policy = router::parse_path_policy(options.path_policy);
  if (!policy) fail(ErrorKind::kInvalidArgument, "--path-policy must be dual, prefill or decode");
  config.scheduler.path_policy = *policy;
  config.kv_secret = read_kv_secret(options.kv_secret, options.kv_secret_file);
  if (config.kv_secret.empty())
    spdlog::info("no --kv-transfer-secret-file: calls to the engines' /loom/kv/ routes are unsigned (engines "
                 "with a secret refuse them)");
  if (config.prefill_urls.empty())
    spdlog::warn("no --prefill engine: every request goes whole to a decode engine");
  router::RouterServer server(config);
  const int num_answered = server.connect_engines(options.engine_timeout_seconds);
  spdlog::info("{} of {} engines answered /loom/kv/status", num_answered,
               config.prefill_urls.size() + config.decode_urls.size());
  server.bind();
  const auto shutdown_timeout = std::chrono::milliseconds(static_cast<int64_t>(options.shutdown_timeout_seconds * 1e3));
  StopSignalWatcher signal_watcher([&](int signal_number) {
    spdlog::info("signal {}: draining (new connections refused; requests in flight get up to {} s)", signal_number,
                 options.shutdown_timeout_seconds);
    const bool drained = server.shutdown(shutdown_timeout);
    spdlog::info(drained ? "every request in flight finished" : "requests still running were closed");
  });
  spdlog::info("routing on http://{}:{} ({} prefill, {} decode engines, path policy {})", config.http.host,
               server.bound_port(), config.prefill_urls.size(), config.decode_urls.size(), options.path_policy);
  server.run();
  server.stop();
  signal_watcher.finish();
  spdlog::info("stopped");
  return 0;
}

}  // namespace

CommandRunner register_router(CLI::App& app) {
  auto options = std::make_shared<RouterOptions>();
  router::RouterConfig& config = options->config;
  app.add_option("--port", config.http.port, "Port (0 = any free port)")->required()->check(CLI::Range(0, 65535));
  app.add_option("--host", config.http.host, "Address to bind")->capture_default_str();
  app.add_option("--prefill", config.prefill_urls, "A prefill engine, http://HOST:PORT (repeatable)");
  app.add_option("--decode", config.decode_urls, "A decode engine, http://HOST:PORT (repeatable)")->required();
  app.add_option("--api-key", config.api_key,
                 "Require Authorization: Bearer KEY on /v1/* and /loom/*, and send it to the engines");
  app.add_option("--kv-transfer-secret-file", options->kv_secret_file,
                 "File holding the engines' KV transfer secret (their --kv-transfer-secret-file): signs every "
                 "call to their /loom/kv/ routes");
  app.add_option("--kv-transfer-secret", options->kv_secret,
                 "The secret itself (visible in the process list: prefer --kv-transfer-secret-file)");
  app.add_option("--path-policy", options->path_policy,
                 "Where blocks only in storage are read: dual (the side whose queue is shorter, DualPath), prefill "
                 "(storage -> PE) or decode (storage -> DE -> PE)")
      ->check(CLI::IsMember({"dual", "prefill", "decode"}))->capture_default_str();
  app.add_option("--link-bandwidth", config.link_bandwidth,
                 "PE <-> DE link bytes/s for the path choice (suffix K, M, G allowed; 0 = measured from past "
                 "transfers)")
      ->transform(byte_size_transform())->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--engine-timeout", options->engine_timeout_seconds,
                 "Seconds to wait at start for engines to answer /loom/kv/status (they may still be loading)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--device-kv-timeout", config.device_kv_timeout_seconds,
                 "Seconds a decode engine keeps blocks reserved for a device-to-device KV transfer (engines with "
                 "--kv-device-plane); past it the decode engine recomputes")
      ->check(CLI::Range(0.1, 600.0))
      ->capture_default_str();
  app.add_option("--retry-seconds", config.retry_seconds, "Seconds a failed engine is skipped")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--max-engine-tokens", config.scheduler.max_engine_tokens,
                 "A PE with more unfinished prompt tokens than this gets no new request (DualPath's beta)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--short-read-queue-bytes", config.scheduler.short_read_queue_bytes,
                 "PEs whose storage read queue is at most this many bytes come first (DualPath's alpha; suffix K, "
                 "M, G allowed)")
      ->transform(byte_size_transform())->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--status-refresh-seconds", config.status_refresh_seconds,
                 "Engines' /loom/kv/status is fetched at most this often (by requests as they come)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--shutdown-timeout", options->shutdown_timeout_seconds,
                 "On SIGINT/SIGTERM: seconds requests in flight may take to finish")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--http-threads", config.http.num_handler_threads,
                 "Requests handled at once (a streaming request holds one)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--max-request-bytes", config.http.max_request_bytes, "Larger request bodies get 413")
      ->transform(byte_size_transform())->check(CLI::PositiveNumber)->capture_default_str();
  return [options] { return run_router(*options); };
}

}  // namespace loom::cli
