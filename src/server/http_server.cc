#include "server/http_server.h"

#include <sys/socket.h>

#include <filesystem>
#include <mutex>

#include <httplib.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "model/loader.h"
#include "server/api_error.h"
#include "server/completion_handler.h"
#include "server/metrics_exporter.h"
#include "server/workflow_routes.h"

namespace loom::server {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

void send_error(httplib::Response& response, const ApiError& error) {
  response.status = error.status();
  if (error.retry_after_seconds() > 0) response.set_header("Retry-After", std::to_string(error.retry_after_seconds()));
  response.set_content(error.body(), "application/json");
}

// Runs a route body, turning every failure into an OpenAI-style error response.
template <typename Body>
void guarded(httplib::Response& response, Body&& body) {
  try {
    body();
  } catch (const ApiError& error) {
    send_error(response, error);
  } catch (const Error& error) {
    send_error(response, api_error_from(error));
  } catch (const std::exception& error) {
    spdlog::error("request failed: {}", error.what());
    send_error(response, ApiError(500, error.what(), "server_error"));
  }
}

Json parse_object(const std::string& body) {
  Json json;
  try {
    json = Json::parse(body);
  } catch (const Json::parse_error& error) {
    throw ApiError(400, std::string("the body is not valid JSON: ") + error.what());
  }
  if (!json.is_object()) throw ApiError(400, "the body must be a JSON object");
  return json;
}

std::string required_string(const Json& body, const char* key) {
  if (!body.contains(key) || !body[key].is_string() || body[key].get<std::string>().empty())
    throw_bad_request(key, fmt::format("'{}' must be a non-empty string", key));
  return body[key].get<std::string>();
}

bool is_within(const fs::path& path, const fs::path& directory) {
  auto mismatch = std::mismatch(directory.begin(), directory.end(), path.begin(), path.end());
  return mismatch.first == directory.end();
}

}  // namespace

struct HttpServer::Impl {
  Engine& engine;
  ServerConfig config;
  httplib::Server http;
  MetricsExporter metrics;
  CompletionContext completion;
  std::mutex adapter_mutex;  // serialises runtime load/unload
  int listen_socket = -1;    // recorded by the socket-options hook, for the backlog below

  Impl(Engine& engine_ref, ServerConfig server_config, const std::atomic<bool>& stopping)
      : engine(engine_ref), config(std::move(server_config)) {
    completion.engine = &engine;
    completion.tokenizer = engine.model().tokenizer.get();
    completion.stopping = &stopping;
    completion.parse.tokenizer = completion.tokenizer;
    completion.parse.base_model_names = {config.served_model_name};
    if (!config.model_path.empty() && config.model_path != config.served_model_name)
      completion.parse.base_model_names.push_back(config.model_path);
    completion.parse.has_adapter = [this](const std::string& name) {
      for (const auto& adapter : engine.adapters())
        if (adapter.name == name) return true;
      return false;
    };
    completion.parse.max_context_tokens = engine.max_context_tokens();
    completion.parse.limits = config.request_limits;
  }

  void install_routes();
  void handle_models(httplib::Response& response);
  void handle_load_adapter(const httplib::Request& request, httplib::Response& response);
  void handle_unload_adapter(const httplib::Request& request, httplib::Response& response);
  std::string checked_lora_path(const std::string& lora_path) const;
};

void HttpServer::Impl::install_routes() {
  const int num_threads = config.num_http_threads;
  http.new_task_queue = [num_threads] { return new httplib::ThreadPool(static_cast<size_t>(num_threads)); };
  http.set_payload_max_length(config.max_request_bytes);
  // Clients idle between requests; a long read timeout keeps slow uploads working.
  http.set_read_timeout(60, 0);
  http.set_write_timeout(60, 0);
  http.set_socket_options([this](socket_t socket) {
    httplib::default_socket_options(socket);
    listen_socket = socket;
  });

  http.set_pre_routing_handler([this](const httplib::Request& request, httplib::Response& response) {
    // Compressed chunks would sit in zlib's buffer and stall token streaming.
    const_cast<httplib::Request&>(request).headers.erase("Accept-Encoding");
    if (config.api_key.empty() || request.path.rfind("/v1/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    if (request.get_header_value("Authorization") == "Bearer " + config.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(response, ApiError(401, "Incorrect or missing API key (send Authorization: Bearer KEY)",
                                  "authentication_error", "", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  // Statuses raised by httplib itself (413, 404 for unknown routes, 400 for bad
  // framing) get an OpenAI-style body; our own errors already have one.
  http.set_error_handler([](const httplib::Request& request, httplib::Response& response) {
    if (!response.body.empty() || response.is_chunked_content_provider_) return;
    if (response.status == 413)
      send_error(response, ApiError(413, "the request body is larger than --max-request-bytes", "invalid_request_error",
                                    "", "request_too_large"));
    else if (response.status == 404)
      send_error(response, ApiError(404, "no route " + request.method + " " + request.path, "invalid_request_error",
                                    "", "not_found"));
    else
      send_error(response, ApiError(response.status, "bad request", "invalid_request_error"));
  });

  http.Get("/health", [this](const httplib::Request&, httplib::Response& response) {
    if (completion.stopping->load()) {
      send_error(response, ApiError(503, "shutting down", "server_error"));
      return;
    }
    response.set_content("{\"status\":\"ok\"}", "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    guarded(response, [&] {
      metrics.absorb(engine.take_metrics());
      response.set_content(metrics.render(), "text/plain; version=0.0.4");
    });
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& response) {
    guarded(response, [&] { handle_models(response); });
  });
  http.Post("/v1/completions", [this](const httplib::Request& request, httplib::Response& response) {
    guarded(response, [&] { handle_completion(Endpoint::kCompletions, completion, request, response); });
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& request, httplib::Response& response) {
    guarded(response, [&] { handle_completion(Endpoint::kChatCompletions, completion, request, response); });
  });
  // Workflow API (server/workflow_routes.h). Ids are URL-safe by rule, so one path segment.
  const std::string workflow_path = R"(/v1/workflows/([^/]+))";
  auto json_route = [this](httplib::Response& response, auto&& handler) {
    guarded(response, [&] { response.set_content(handler(), "application/json"); });
  };
  http.Put(workflow_path, [this, json_route](const httplib::Request& request, httplib::Response& response) {
    json_route(response, [&] { return put_workflow(engine, request.matches[1].str(), request.body); });
  });
  http.Post(workflow_path + "/progress",
            [this, json_route](const httplib::Request& request, httplib::Response& response) {
              json_route(response,
                         [&] { return post_workflow_progress(engine, request.matches[1].str(), request.body); });
            });
  http.Get(workflow_path, [this, json_route](const httplib::Request& request, httplib::Response& response) {
    json_route(response, [&] { return get_workflow(engine, request.matches[1].str()); });
  });
  http.Delete(workflow_path, [this, json_route](const httplib::Request& request, httplib::Response& response) {
    json_route(response, [&] { return delete_workflow(engine, request.matches[1].str()); });
  });
  // As in vLLM, the runtime adapter routes exist only when enabled (404 otherwise).
  if (config.allow_runtime_lora) {
    http.Post("/v1/load_lora_adapter", [this](const httplib::Request& request, httplib::Response& response) {
      guarded(response, [&] { handle_load_adapter(request, response); });
    });
    http.Post("/v1/unload_lora_adapter", [this](const httplib::Request& request, httplib::Response& response) {
      guarded(response, [&] { handle_unload_adapter(request, response); });
    });
  }
}

void HttpServer::Impl::handle_models(httplib::Response& response) {
  const int64_t created = std::time(nullptr);
  const int32_t max_model_len = engine.max_context_tokens();
  Json data = Json::array();
  data.push_back({{"id", config.served_model_name},
                  {"object", "model"},
                  {"created", created},
                  {"owned_by", "loom"},
                  {"root", config.model_path},
                  {"parent", nullptr},
                  {"max_model_len", max_model_len}});
  for (const auto& adapter : engine.adapters())
    data.push_back({{"id", adapter.name},
                    {"object", "model"},
                    {"created", created},
                    {"owned_by", "loom"},
                    {"root", adapter.path},
                    {"parent", config.served_model_name},
                    {"max_model_len", max_model_len},
                    {"kv_sharing", kv_sharing_name(adapter.sharing)}});
  response.set_content(Json{{"object", "list"}, {"data", data}}.dump(), "application/json");
}

std::string HttpServer::Impl::checked_lora_path(const std::string& lora_path) const {
  if (config.lora_dir.empty()) return lora_path;
  std::error_code ignored;
  const fs::path directory = fs::weakly_canonical(config.lora_dir, ignored);
  fs::path path = lora_path;
  if (path.is_relative()) path = directory / path;
  path = fs::weakly_canonical(path, ignored);
  if (!is_within(path, directory))
    throw_bad_request("lora_path", fmt::format("'{}' is outside --lora-dir {}", lora_path, config.lora_dir));
  return path.string();
}

void HttpServer::Impl::handle_load_adapter(const httplib::Request& request, httplib::Response& response) {
  const Json body = parse_object(request.body);
  const std::string name = required_string(body, "lora_name");
  const std::string path = checked_lora_path(required_string(body, "lora_path"));
  std::optional<KvSharing> sharing;  // absent or null: the adapter's own choice (choose_kv_sharing)
  if (body.contains("kv_sharing") && !body["kv_sharing"].is_null()) {
    const Json& value = body["kv_sharing"];
    if (value.is_string()) sharing = parse_kv_sharing(value.get<std::string>());
    if (!sharing)
      throw_bad_request("kv_sharing", fmt::format("'kv_sharing' must be one of \"isolated\", \"activated\", "
                                                  "\"base\", \"forked\" (got {})",
                                                  value.dump()));
  }
  std::lock_guard lock(adapter_mutex);
  if (name == config.served_model_name || completion.parse.has_adapter(name))
    throw_bad_request("lora_name", fmt::format("The lora adapter '{}' has already been loaded.", name));
  try {
    engine.load_adapter(name, path, sharing);
  } catch (const Error& error) {
    // A missing or malformed adapter is the client's input: 400 as vLLM answers.
    if (error.kind() == ErrorKind::kInternal) throw;
    throw ApiError(400, fmt::format("loading adapter '{}' from {} failed: {}", name, path, error.what()),
                   "invalid_request_error", "lora_path");
  }
  std::string mode = "?";
  for (const auto& adapter : engine.adapters())
    if (adapter.name == name) mode = kv_sharing_name(adapter.sharing);
  spdlog::info("loaded adapter '{}' from {} (kv_sharing {})", name, path, mode);
  response.set_content(fmt::format("Success: LoRA adapter '{}' added successfully.", name), "text/plain");
}

void HttpServer::Impl::handle_unload_adapter(const httplib::Request& request, httplib::Response& response) {
  const Json body = parse_object(request.body);
  const std::string name = required_string(body, "lora_name");
  std::lock_guard lock(adapter_mutex);
  if (!completion.parse.has_adapter(name))
    throw ApiError(404, fmt::format("The lora adapter '{}' cannot be found.", name), "invalid_request_error",
                   "lora_name", "not_found");
  try {
    engine.unload_adapter(name);
  } catch (const Error& error) {
    throw api_error_from(error, "lora_name");
  }
  spdlog::info("unloaded adapter '{}'", name);
  response.set_content(fmt::format("Success: LoRA adapter '{}' removed successfully.", name), "text/plain");
}

HttpServer::HttpServer(Engine& engine, ServerConfig config)
    : impl_(std::make_unique<Impl>(engine, std::move(config), stopping_)) {
  impl_->install_routes();
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::bind() {
  const ServerConfig& config = impl_->config;
  if (config.port == 0) {
    bound_port_ = impl_->http.bind_to_any_port(config.host);
    if (bound_port_ < 0) fail(ErrorKind::kInvalidArgument, "cannot bind {}:(any port)", config.host);
  } else {
    if (!impl_->http.bind_to_port(config.host, config.port))
      fail(ErrorKind::kInvalidArgument, "cannot bind {}:{} (in use, or a bad --host?)", config.host, config.port);
    bound_port_ = config.port;
  }
  // Debian's compiled cpp-httplib listens with a backlog of 5: a burst of
  // concurrent clients overflows it and connections get dropped. Linux lets a
  // second listen() on the bound socket raise the backlog.
  if (impl_->listen_socket >= 0) ::listen(impl_->listen_socket, SOMAXCONN);
}

void HttpServer::run() { impl_->http.listen_after_bind(); }

void HttpServer::stop() {
  if (stopping_.exchange(true)) return;
  impl_->http.stop();
}

}  // namespace loom::server
