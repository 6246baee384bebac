// `loom router`: the global scheduler in front of prefill engines (PEs) and
// decode engines (DEs) for prefill/decode disaggregation (DualPath), on the
// same HTTP transport as `loom serve` (server/http_transport.h).
//
// Routes:
//   POST /v1/completions, /v1/chat/completions: the disaggregated flow
//        (router/completion_flow.h): probe the PE, read storage-only blocks
//        on the cheaper side, prefill on the PE, push its KV to the DE, then
//        relay the DE's answer (whole, or SSE as it arrives).
//   GET  /v1/models: a DE's, proxied.
//   GET  /health: 200 while some DE is reachable, else 503.
//   GET  /metrics: the router's own counters (router/router_metrics.h).
//   GET  /loom/router/status: every engine's URL, role, health, load, last status.
//   anything else: 404 (405 for a known path with another method).
// Errors have OpenAI's shape {"error":{"message","type","param","code"}}.
// With api_key, /v1/* and /loom/* need "Authorization: Bearer KEY", and the
// router sends the same key to the engines. With kv_secret, every call to an
// engine's /loom/kv/* routes is signed with it (server/kv_auth.h).
//
// Shutdown: shutdown(timeout) stops accepting, lets requests in flight finish
// for up to `timeout`, then closes what is left.
//
// Threads: connect_engines/bind/run on one thread; shutdown() and stop() from
// any other; requests are handled on the transport's handler threads.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "router/dual_path_scheduler.h"
#include "router/engine_client.h"
#include "server/http_transport.h"

namespace loom::router {

struct RouterConfig {
  server::TransportConfig http;  // light_paths is set by the router
  std::vector<std::string> prefill_urls, decode_urls;  // at least one DE
  std::string api_key;           // "" = none
  std::string kv_secret;         // the engines' KV transfer secret: signs /loom/kv/* calls ("" = none)
  SchedulerConfig scheduler;
  double link_bandwidth = 0.0;   // PE <-> DE bytes/s; 0 = measured from past transfers
  double retry_seconds = 5.0;    // a failed engine is skipped this long
  double status_refresh_seconds = 0.1;
  double prefill_send_wait_seconds = 5.0;  // the PE's wait for its own blocks before pushing them
  // A device-to-device transfer's deadline at the DE (--device-kv-timeout): the PE's prefill
  // (queueing included) must stream every layer within it, else the DE recomputes.
  double device_kv_timeout_seconds = 60.0;
  EngineClientConfig engine_client;  // timeouts and api key of every engine call (url unused)
};

class RouterServer {
 public:
  // Throws Error(kInvalidArgument) without a decode engine.
  explicit RouterServer(RouterConfig config);
  ~RouterServer();
  RouterServer(const RouterServer&) = delete;
  RouterServer& operator=(const RouterServer&) = delete;

  // Fetches every engine's /loom/kv/status, retrying for up to `timeout_seconds`,
  // and logs each. Returns how many engines answered (the others are retried later).
  int connect_engines(double timeout_seconds);
  // Binds host:port; throws Error(kInvalidArgument) when it cannot.
  void bind();
  int bound_port() const;
  // Serves until shutdown() or stop().
  void run();
  // Returns true when every request in flight finished within `timeout`; run() then returns.
  bool shutdown(std::chrono::milliseconds timeout);
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::router
