#include "router/router_server.h"

#include <initializer_list>
#include <optional>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "router/completion_flow.h"
#include "router/engine_registry.h"
#include "router/router_metrics.h"
#include "server/api_error.h"
#include "server/auth.h"
#include "server/json_output.h"
#include "util/error.h"

namespace loom::router {
namespace {

using server::ApiError;
using server::HttpRequest;
using server::HttpResponse;

HttpResponse error_response(const ApiError& error) {
  HttpResponse response;
  response.status = error.status();
  if (error.retry_after_seconds() > 0)
    response.headers.emplace_back("Retry-After", std::to_string(error.retry_after_seconds()));
  response.body = error.body();
  return response;
}

HttpResponse body_response(std::string body, std::string content_type = "application/json") {
  HttpResponse response;
  response.content_type = std::move(content_type);
  response.body = std::move(body);
  return response;
}

EngineRegistryConfig registry_config(const RouterConfig& config) {
  EngineRegistryConfig registry;
  registry.prefill_urls = config.prefill_urls;
  registry.decode_urls = config.decode_urls;
  registry.client = config.engine_client;
  registry.client.api_key = config.api_key;
  registry.client.kv_secret = config.kv_secret;
  registry.retry_seconds = config.retry_seconds;
  registry.refresh_seconds = config.status_refresh_seconds;
  return registry;
}

}  // namespace

struct RouterServer::Impl {
  RouterConfig config;
  RouterMetrics metrics;
  EngineRegistry engines;
  FlowContext flow;
  std::atomic<bool> stopping{false};
  std::unique_ptr<server::HttpTransport> transport;

  explicit Impl(RouterConfig router_config)
      : config(std::move(router_config)), engines(registry_config(config), metrics) {
    flow.config = &config;
    flow.engines = &engines;
    flow.metrics = &metrics;
    server::TransportConfig transport_config = config.http;
    transport_config.light_paths = {"/health", "/metrics"};
    transport = std::make_unique<server::HttpTransport>(
        transport_config, [this](HttpRequest& request) { return handle(request); },
        [](int status, const std::string& message, const std::string& code) {
          return error_response(
              ApiError(status, message, status >= 500 ? "server_error" : "invalid_request_error", "", code));
        });
  }

  HttpResponse handle(HttpRequest& request) {
    try {
      if (request.arrived_while_draining && request.path != "/health") {
        HttpResponse response = error_response(
            ApiError(503, "the router is shutting down", "server_error", "", "server_shutting_down"));
        response.close_connection = true;
        return response;
      }
      if (!authorized(request))
        return error_response(ApiError(401, "Incorrect or missing API key (send Authorization: Bearer KEY)",
                                       "authentication_error", "", "invalid_api_key"));
      return route(request);
    } catch (const ApiError& error) {
      spdlog::log(error.status() >= 500 ? spdlog::level::warn : spdlog::level::info, "{} {}: status {}: {}",
                  request.method, request.path, error.status(), error.message());
      return error_response(error);
    } catch (const Error& error) {
      return error_response(server::api_error_from(error));
    }
  }

  bool authorized(const HttpRequest& request) const {
    if (config.api_key.empty()) return true;
    const bool guarded = request.path.rfind("/v1/", 0) == 0 || request.path.rfind("/loom/", 0) == 0;
    return !guarded || server::api_key_matches(request.header("Authorization"), config.api_key);
  }

  HttpResponse route(HttpRequest& request) {
    const std::string& path = request.path;
    auto wrong_method = [&](const char* allowed) -> std::optional<HttpResponse> {
      if (request.method == allowed) return std::nullopt;
      HttpResponse response = error_response(
          ApiError(405, fmt::format("method {} is not allowed on {} (allowed: {})", request.method, path, allowed),
                   "invalid_request_error", "", "method_not_allowed"));
      response.headers.emplace_back("Allow", allowed);
      return response;
    };
    if (path == "/v1/completions" || path == "/v1/chat/completions") {
      if (auto refused = wrong_method("POST")) return *refused;
      return handle_completion(flow, request, path == "/v1/chat/completions");
    }
    if (path == "/health") {
      if (auto refused = wrong_method("GET")) return *refused;
      if (stopping.load()) throw ApiError(503, "shutting down", "server_error");
      engines.refresh_statuses();
      for (size_t i = 0; i < engines.num(EngineGroup::kDecode); ++i)
        if (engines.available(EngineGroup::kDecode, i)) return body_response("{\"status\":\"ok\"}");
      throw ApiError(503, "no decode engine is reachable", "server_error", "", "no_engine_available");
    }
    if (path == "/metrics") {
      if (auto refused = wrong_method("GET")) return *refused;
      return body_response(metrics.prometheus_text(), "text/plain; version=0.0.4");
    }
    if (path == "/v1/models") {
      if (auto refused = wrong_method("GET")) return *refused;
      return models();
    }
    if (path == "/loom/router/status") {
      if (auto refused = wrong_method("GET")) return *refused;
      engines.refresh_statuses();
      return body_response(server::dump_json(engines.status_json()));
    }
    throw ApiError(404, fmt::format("no route {} {}", request.method, path), "invalid_request_error", "",
                   "not_found");
  }

  // The first available DE's /v1/models; a DE that fails is marked and the next tried.
  HttpResponse models() {
    for (size_t i = 0; i < engines.num(EngineGroup::kDecode); ++i) {
      if (!engines.available(EngineGroup::kDecode, i)) continue;
      EngineResult<HttpReply> reply = engines.client(EngineGroup::kDecode, i).get("/v1/models");
      if (reply.status == CallStatus::kFailed) {
        engines.mark_failed(EngineGroup::kDecode, i, "models: " + reply.error);
        continue;
      }
      HttpResponse response;
      response.status = reply.reply.status;
      response.content_type = reply.reply.content_type.empty() ? "application/json" : reply.reply.content_type;
      response.body = reply.reply.body;
      return response;
    }
    throw ApiError(503, "no decode engine is available", "server_error", "", "no_engine_available");
  }
};

RouterServer::RouterServer(RouterConfig config) {
  if (config.decode_urls.empty())
    throw Error(ErrorKind::kInvalidArgument, "the router needs at least one decode engine", "pass --decode URL");
  impl_ = std::make_unique<Impl>(std::move(config));
}

RouterServer::~RouterServer() {
  if (impl_) stop();
}

int RouterServer::connect_engines(double timeout_seconds) { return impl_->engines.wait_for_engines(timeout_seconds); }

void RouterServer::bind() { impl_->transport->bind(); }

int RouterServer::bound_port() const { return impl_->transport->bound_port(); }

void RouterServer::run() { impl_->transport->run(); }

bool RouterServer::shutdown(std::chrono::milliseconds timeout) {
  impl_->stopping = true;
  impl_->transport->stop_accepting();
  const bool drained = impl_->transport->wait_for_handlers(timeout);
  if (!drained)
    spdlog::warn("shutdown: {} request(s) still running after {} ms: closing them", impl_->transport->num_handling(),
                 timeout.count());
  impl_->transport->stop();
  return drained;
}

void RouterServer::stop() {
  impl_->stopping = true;
  impl_->transport->stop();
}

}  // namespace loom::router
