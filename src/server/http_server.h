// The OpenAI-compatible HTTP server (cpp-httplib). HTTP worker threads parse,
// validate and tokenize requests, submit them to the engine and stream results
// back; the engine thread runs the model.
//
// Routes: GET /health, GET /metrics, GET /v1/models, POST /v1/completions,
// POST /v1/chat/completions, PUT/GET/DELETE /v1/workflows/{id} and POST
// /v1/workflows/{id}/progress (server/workflow_routes.h), and with allow_runtime_lora POST
// /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM bodies).
//
// Ownership: borrows the engine, which must outlive the server.
// Threads: start/run on one thread; stop() from any thread (a signal watcher).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "server/openai_request.h"

namespace loom::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;                   // 0: an ephemeral port (see bound_port())
  std::string api_key;               // "" = no authentication
  std::string served_model_name;     // the base model's name in `model` and /v1/models
  std::string model_path;            // also accepted as the base model's name
  bool allow_runtime_lora = false;   // enables /v1/load_lora_adapter and /v1/unload_lora_adapter
  std::string lora_dir;              // "" = any path; else runtime adapters must lie under it
  size_t max_request_bytes = 8u << 20;  // bodies over this get 413
  int num_http_threads = 128;        // concurrent connections served (streams hold one each)
  RequestLimits request_limits;      // per-request bounds (n, stop strings, output tokens)
};

class HttpServer {
 public:
  HttpServer(Engine& engine, ServerConfig config);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port. Throws Error(kInvalidArgument) when it cannot.
  void bind();
  int bound_port() const { return bound_port_; }
  // Serves until stop(); returns once every in-flight request has ended.
  void run();
  // Stops accepting; in-flight handlers stop waiting on streams that go quiet.
  // Safe from any thread, idempotent.
  void stop();
  bool is_stopping() const { return stopping_.load(); }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int bound_port_ = 0;
  std::atomic<bool> stopping_{false};
};

}  // namespace loom::server
