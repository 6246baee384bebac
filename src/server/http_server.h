// The OpenAI-compatible HTTP server: the routes, on top of the event-driven
// transport (server/http_transport.h) that owns sockets, limits and deadlines.
// Handler threads parse, validate and tokenize requests, submit them to the
// engine and stream results back; the engine thread runs the model.
//
// Routes: GET /health, GET /metrics, GET /v1/models, POST /v1/completions,
// POST /v1/chat/completions, POST /v1/responses and GET/DELETE /v1/responses/{id}
// (server/responses_handler.h), PUT/GET/DELETE /v1/workflows/{id} and POST
// /v1/workflows/{id}/progress (server/workflow_routes.h), and with allow_runtime_lora POST
// /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM bodies), and the KV
// transfer routes GET /loom/kv/status, POST /loom/kv/probe, /loom/kv/send and /loom/kv/reserve
// that `loom router` drives (server/kv_routes.h). Unknown
// paths get 404, a known path with another method 405 (with Allow).
//
// Shutdown: shutdown(timeout) stops accepting, lets requests in flight finish
// for up to `timeout`, then ends the rest explicitly (a 503 body, or an SSE
// error event then [DONE]) and returns once every handler has returned.
//
// Ownership: borrows the engine, which must outlive the server.
// Threads: bind/run on one thread; shutdown() and stop() from any other thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/generation_defaults.h"
#include "server/http_transport.h"
#include "server/kv_routes.h"
#include "server/openai_request.h"
#include "server/response_store.h"

namespace loom::server {

struct ServerConfig {
  // Socket, limits and deadlines (server/http_transport.h says what each does);
  // light_paths is set by the server.
  TransportConfig http;
  std::string api_key;               // "" = no authentication
  bool metrics_require_api_key = false;  // also guard /metrics with api_key
  // The base model's names in `model` and /v1/models (vLLM's --served-model-name, one or more): the first is
  // the one responses carry and metrics label.
  std::vector<std::string> served_model_names;
  std::optional<uint64_t> seed;      // --seed: requests without one get seeds drawn from it (reproducible runs)
  bool log_requests = true;          // a log line per finished completion and per refused request
  SamplingDefaults sampling_defaults;  // --generation-config: what requests that omit a sampling field get
  std::string model_path;            // also accepted as the base model's name
  bool allow_runtime_lora = false;   // enables /v1/load_lora_adapter and /v1/unload_lora_adapter
  std::string lora_dir;              // "" = any path; else runtime adapters must lie under it
  RequestLimits request_limits;      // per-request bounds (n, stop strings, output tokens)
  // --tool-call-parser: how chat outputs are read for tool calls under
  // tool_choice "auto": "auto" (from the chat template), "none", "hermes",
  // "llama3_json", "mistral" (server/tool_choice.h). Another name: the constructor throws.
  std::string tool_call_parser = "auto";
  // --reasoning-parser: "auto" (from the chat template and vocabulary: reasoning/reasoning_detection.h),
  // "none", "qwen3", "deepseek_r1" (reasoning/reasoning_parser.h): chat outputs' thinking goes to
  // reasoning_content. Another name: the constructor throws.
  std::string reasoning_parser = "auto";
  // Jinja source replacing the model's chat templates ("" = the model's own);
  // a syntax error makes the HttpServer constructor throw Error naming the line.
  std::string chat_template;
  // /v1/responses' store (`store`, previous_response_id, GET / DELETE /v1/responses/{id}):
  // --responses-store-max-entries, --responses-store-max-bytes, --responses-store-ttl.
  ResponseStoreConfig responses_store;
  // Prefill/decode disaggregation (--role, --kv-transfer-port): the engine's
  // KV buffer and link, for the /loom/kv/ routes (server/kv_routes.h).
  KvTransferSetup kv_transfer;

  // The first served name ("" when there is none).
  const std::string& served_model_name() const {
    static const std::string none;
    return served_model_names.empty() ? none : served_model_names.front();
  }
};

class HttpServer {
 public:
  HttpServer(Engine& engine, ServerConfig config);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port. Throws Error(kInvalidArgument) when it cannot (port in use).
  void bind();
  int bound_port() const;
  // Serves until shutdown() or stop().
  void run();
  // Graceful: see the header comment. Returns true when every request in
  // flight finished by itself within `timeout`. Then run() returns.
  bool shutdown(std::chrono::milliseconds timeout);
  // Immediate: ends requests in flight at once (explicit errors), closes every
  // connection; run() returns. Idempotent.
  void stop();
  bool is_stopping() const { return stopping_.load(); }
  // MetricsExporter::stats_line over the engine (any thread).
  std::optional<std::string> stats_line(double elapsed_seconds);
  int num_connections() const;

 private:
  struct Impl;
  std::atomic<bool> stopping_{false};     // no new requests
  std::atomic<bool> ending_requests_{false};  // requests in flight end now
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::server
