#include "server/http_server.h"

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <mutex>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "server/api_error.h"
#include "server/auth.h"
#include "server/completion_handler.h"
#include "server/http_transport.h"
#include "server/json_input.h"
#include "server/json_output.h"
#include "server/kv_auth.h"
#include "server/metrics_exporter.h"
#include "server/reasoning_choice.h"
#include "server/responses_handler.h"
#include "server/tokenize_routes.h"
#include "server/workflow_routes.h"
#include "util/prng.h"
#include "util/version.h"

namespace loom::server {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

HttpResponse error_response(const ApiError& error) {
  HttpResponse response;
  response.status = error.status();
  if (error.retry_after_seconds() > 0)
    response.headers.emplace_back("Retry-After", std::to_string(error.retry_after_seconds()));
  response.body = error.body();
  return response;
}

HttpResponse json_response(std::string body) {
  HttpResponse response;
  response.body = std::move(body);
  return response;
}

HttpResponse text_response(std::string body, std::string content_type = "text/plain") {
  HttpResponse response;
  response.content_type = std::move(content_type);
  response.body = std::move(body);
  return response;
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

// The workflow id of "/v1/workflows/{id}" (suffix "") or ".../{id}/progress"
// (suffix "/progress"), or nullopt when `path` is not that route.
std::optional<std::string> workflow_id(const std::string& path, std::string_view suffix) {
  static constexpr std::string_view kPrefix = "/v1/workflows/";
  if (path.size() <= kPrefix.size() + suffix.size() || path.compare(0, kPrefix.size(), kPrefix) != 0 ||
      path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::nullopt;
  std::string id = path.substr(kPrefix.size(), path.size() - kPrefix.size() - suffix.size());
  if (id.empty() || id.find('/') != std::string::npos) return std::nullopt;
  return id;
}

// The id of "/v1/responses/{id}", or nullopt when `path` is not that route.
std::optional<std::string> responses_id(const std::string& path) {
  static constexpr std::string_view kPrefix = "/v1/responses/";
  if (path.size() <= kPrefix.size() || path.compare(0, kPrefix.size(), kPrefix) != 0) return std::nullopt;
  std::string id = path.substr(kPrefix.size());
  if (id.find('/') != std::string::npos) return std::nullopt;
  return id;
}

constexpr std::string_view kModelsPrefix = "/v1/models/";

// OpenAI's system_fingerprint: what would change outputs for the same request
// (build, model, served names, context length), hashed (FNV-1a).
std::string system_fingerprint(const ServerConfig& config, int32_t max_context_tokens) {
  uint64_t hash = 1469598103934665603ULL;
  for (const std::string& part : {std::string(kLoomVersion), config.model_path, config.served_model_name(),
                                  std::to_string(max_context_tokens)})
    for (char c : part + '\0') hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  return fmt::format("fp_{:012x}", hash & 0xFFFFFFFFFFFFULL);
}

}  // namespace

struct HttpServer::Impl {
  Engine& engine;
  ServerConfig config;
  const std::atomic<bool>& stopping;
  MetricsExporter metrics;
  std::unique_ptr<const ChatRenderer> chat_renderer;  // shared by every handler thread; outlives the transport
  CompletionContext completion;
  ResponseStore responses_store;
  ResponsesContext responses;
  KvRouteContext kv_routes;
  std::atomic<int32_t> num_completions{0};  // completion requests in flight
  KvTransferCounters kv_counters;
  std::mutex adapter_mutex;  // serialises runtime load/unload
  std::unique_ptr<HttpTransport> transport;
  // /v1/models' `created`: when the server started, the same in every listing.
  const int64_t started_unix = std::time(nullptr);

  Impl(Engine& engine_ref, ServerConfig server_config, const std::atomic<bool>& stopping_flag,
       const std::atomic<bool>& ending_requests)
      : engine(engine_ref), config(std::move(server_config)), stopping(stopping_flag),
        metrics(config.served_model_name()), responses_store(config.responses_store) {
    completion.engine = &engine;
    responses = {&completion, &responses_store};
    completion.tokenizer = engine.model().tokenizer.get();
    completion.ending_requests = &ending_requests;
    completion.parse.tokenizer = completion.tokenizer;
    completion.parse.base_model_names = config.served_model_names;
    if (!config.model_path.empty() && config.model_path != config.served_model_name())
      completion.parse.base_model_names.push_back(config.model_path);
    if (config.seed) {
      // The n-th request without a seed gets the same seed in every run: SplitMix64's n-th output, from a
      // shared counter (Prng itself is not thread-safe).
      auto counter = std::make_shared<std::atomic<uint64_t>>(*config.seed);
      completion.parse.next_default_seed = [counter] {
        return Prng(counter->fetch_add(0x9e3779b97f4a7c15ull)).next_u64();
      };
    }
    completion.parse.has_adapter = [this](const std::string& name) {
      for (const auto& adapter : engine.adapters())
        if (adapter.name == name) return true;
      return false;
    };
    completion.parse.max_context_tokens = engine.max_context_tokens();
    completion.parse.limits = config.request_limits;
    completion.parse.sampling_defaults = config.sampling_defaults;
    completion.parse.constraints = std::make_shared<grammar::ConstraintCompiler>(
        grammar::TokenVocabulary::from_tokenizer(*completion.tokenizer));
    const ModelChatTemplates& templates = completion.tokenizer->model_chat_templates();
    chat_renderer = std::make_unique<ChatRenderer>(templates, config.chat_template);
    completion.parse.chat_renderer = chat_renderer.get();
    metrics.set_server_caches([this] {
      std::vector<CacheGauge> caches = completion.tokenizer->cache_gauges();
      caches.push_back(completion.parse.constraints->cache_gauge());
      caches.push_back(chat_renderer->cache_gauge());
      return caches;
    });
    // The parser follows the served template (--chat-template, else the model's
    // tool_use one, else its default); a per-request chat_template does not change it.
    const std::string& template_source = !config.chat_template.empty() ? config.chat_template
                                         : !templates.tool_use_source.empty() ? templates.tool_use_source
                                                                              : templates.default_source;
    completion.parse.tool_call_parser = resolve_tool_call_parser(config.tool_call_parser, template_source);
    completion.parse.chat_template_renders_tools = chat_template_renders_tools(template_source);
    spdlog::info("tool calls: '{}' parser (--tool-call-parser {})",
                 toolcall::parser_name(completion.parse.tool_call_parser), config.tool_call_parser);
    const reasoning::ReasoningDetection reasoning_parser =
        resolve_reasoning_parser(config.reasoning_parser, template_source, *chat_renderer, *completion.tokenizer);
    completion.parse.reasoning_parser = reasoning_parser.kind;
    spdlog::info("reasoning: '{}' parser (--reasoning-parser {}{})", reasoning::reasoning_parser_name(reasoning_parser.kind),
                 config.reasoning_parser, config.reasoning_parser == "auto" ? ": " + reasoning_parser.reason : "");

    kv_routes = {&engine, &completion.parse, &config.kv_transfer, &num_completions, &kv_counters};
    completion.device_kv = {config.kv_transfer.device_plane != nullptr, config.kv_transfer.secret,
                            config.kv_transfer.client ? &config.kv_transfer.client->peers() : nullptr};
    completion.system_fingerprint = system_fingerprint(config, engine.max_context_tokens());
    completion.log_requests = config.log_requests;

    TransportConfig transport_config = config.http;
    transport_config.light_paths = {"/health", "/ping", "/version", "/metrics"};
    transport = std::make_unique<HttpTransport>(
        transport_config, [this](HttpRequest& request) { return handle(request); },
        [](int status, const std::string& message, const std::string& code) {
          return error_response(ApiError(status, message, status >= 500 ? "server_error" : "invalid_request_error",
                                         "", code));
        });
  }

  HttpResponse handle(HttpRequest& request);
  // A log line for a request answered with an error (clients' mistakes at info).
  void log_refused(const HttpRequest& request, const ApiError& error) const {
    if (!config.log_requests && error.status() < 500) return;
    spdlog::log(error.status() >= 500 ? spdlog::level::warn : spdlog::level::info,
                "request {} {} status={} {}{}: {}", request.method, request.path, error.status(), error.type(),
                error.param().empty() ? "" : " param=" + error.param(), error.message());
  }
  bool ending_requests_now() const { return completion.ending_requests->load(); }
  // The route's answer; throws ApiError / loom::Error for failures.
  HttpResponse route(HttpRequest& request);
  bool authorized(const HttpRequest& request) const;
  HttpResponse handle_models(const std::string* only = nullptr);
  HttpResponse handle_load_adapter(const HttpRequest& request);
  HttpResponse handle_unload_adapter(const HttpRequest& request);
  std::string checked_lora_path(const std::string& lora_path) const;
};

HttpResponse HttpServer::Impl::handle(HttpRequest& request) {
  try {
    if ((request.arrived_while_draining || ending_requests_now()) && request.path != "/health") {
      HttpResponse response = error_response(
          ApiError(503, "the server is shutting down", "server_error", "", "server_shutting_down"));
      response.close_connection = true;
      return response;
    }
    if (!authorized(request))
      return error_response(ApiError(401, "Incorrect or missing API key (send Authorization: Bearer KEY)",
                                     "authentication_error", "", "invalid_api_key"));
    return route(request);
  } catch (const ApiError& error) {
    log_refused(request, error);
    return error_response(error);
  } catch (const Error& error) {
    const ApiError api_error = api_error_from(error);  // logs internal errors itself
    log_refused(request, api_error);
    return error_response(api_error);
  } catch (const std::exception& error) {
    spdlog::error("{} {}: {}", request.method, request.path, error.what());
    return error_response(ApiError(500, "internal server error", "server_error", "", "internal_error"));
  }
}

bool HttpServer::Impl::authorized(const HttpRequest& request) const {
  if (config.api_key.empty()) return true;
  const bool guarded = request.path.rfind("/v1/", 0) == 0 || request.path.rfind("/loom/", 0) == 0 ||
                       (config.metrics_require_api_key && request.path == "/metrics");
  return !guarded || api_key_matches(request.header("Authorization"), config.api_key);
}

HttpResponse HttpServer::Impl::route(HttpRequest& request) {
  const std::string& path = request.path;
  const std::string& method = request.method;
  // Each known path with the methods it takes; a path match with another method is 405.
  auto wrong_method = [&](std::initializer_list<const char*> methods) -> std::optional<HttpResponse> {
    for (const char* allowed : methods)
      if (method == allowed) return std::nullopt;
    std::string list;
    for (const char* allowed : methods) list += (list.empty() ? "" : ", ") + std::string(allowed);
    HttpResponse response = error_response(ApiError(
        405, fmt::format("method {} is not allowed on {} (allowed: {})", method, path, list), "invalid_request_error",
        "", "method_not_allowed"));
    response.headers.emplace_back("Allow", list);
    return response;
  };
  if (path == "/health" || path == "/ping") {  // /ping: vLLM's (SageMaker's) spelling, GET or POST
    if (auto refused = path == "/ping" ? wrong_method({"GET", "POST"}) : wrong_method({"GET"})) return *refused;
    if (stopping.load()) throw ApiError(503, "shutting down", "server_error");
    return json_response("{\"status\":\"ok\"}");
  }
  if (path == "/version") {
    if (auto refused = wrong_method({"GET"})) return *refused;
    return json_response(dump_json(Json{{"version", kLoomVersion}}));
  }
  if (path == "/tokenize" || path == "/detokenize") {
    if (auto refused = wrong_method({"POST"})) return *refused;
    return json_response(path == "/tokenize" ? tokenize_body(completion.parse, request.body)
                                             : detokenize_body(completion.parse, request.body));
  }
  if (path == "/metrics") {
    if (auto refused = wrong_method({"GET"})) return *refused;
    return text_response(metrics.scrape(engine) + kv_transfer_metrics(kv_routes, metrics.model_label()),
                         "text/plain; version=0.0.4");
  }
  if (path == "/v1/models") {
    if (auto refused = wrong_method({"GET"})) return *refused;
    return handle_models();
  }
  if (path.rfind(kModelsPrefix, 0) == 0 && path.size() > kModelsPrefix.size()) {
    if (auto refused = wrong_method({"GET"})) return *refused;
    // The rest of the (percent-decoded) path: an adapter name may hold '/' ("org/name").
    const std::string id = path.substr(kModelsPrefix.size());
    return handle_models(&id);
  }
  if (path == "/v1/workflows") {
    if (auto refused = wrong_method({"GET"})) return *refused;
    return json_response(list_workflows(engine));
  }
  if (path == "/v1/completions" || path == "/v1/chat/completions") {
    if (auto refused = wrong_method({"POST"})) return *refused;
    // Counted until the whole body or the stream has gone out (/loom/kv/status's num_requests).
    ++num_completions;
    auto in_flight = std::shared_ptr<std::atomic<int32_t>>(&num_completions, [](std::atomic<int32_t>* count) { --*count; });
    HttpResponse response = handle_completion(
        path == "/v1/completions" ? Endpoint::kCompletions : Endpoint::kChatCompletions, completion, request);
    if (response.stream)
      response.stream = [stream = std::move(response.stream), in_flight](ResponseSink& sink) { stream(sink); };
    return response;
  }
  if (path == "/v1/responses") {
    if (auto refused = wrong_method({"POST"})) return *refused;
    ++num_completions;
    auto in_flight = std::shared_ptr<std::atomic<int32_t>>(&num_completions, [](std::atomic<int32_t>* count) { --*count; });
    HttpResponse response = handle_create_response(responses, request);
    if (response.stream)
      response.stream = [stream = std::move(response.stream), in_flight](ResponseSink& sink) { stream(sink); };
    return response;
  }
  if (auto id = responses_id(path)) {
    if (auto refused = wrong_method({"GET", "DELETE"})) return *refused;
    return method == "GET" ? handle_get_response(responses, *id) : handle_delete_response(responses, *id);
  }
  if (path.rfind("/loom/kv/", 0) == 0 && !kv_routes.setup->secret.empty() &&
      !kv_request_signed(kv_routes.setup->secret, method, path, request.body, request.header(kKvAuthHeader),
                         unix_seconds_now()))
    throw ApiError(401,
                   fmt::format("/loom/kv/ routes need a request signed with the KV transfer secret ({} header; give "
                               "loom router the engines' --kv-transfer-secret-file)",
                               kKvAuthHeader),
                   "authentication_error", "", "invalid_kv_signature");
  if (path == "/loom/kv/status") {
    if (auto refused = wrong_method({"GET"})) return *refused;
    return json_response(kv_status_body(kv_routes));
  }
  if (path == "/loom/kv/reserve/cancel") {
    if (auto refused = wrong_method({"POST"})) return *refused;
    return json_response(kv_reserve_cancel_body(kv_routes, request.body));
  }
  if (path == "/loom/kv/probe" || path == "/loom/kv/send" || path == "/loom/kv/reserve") {
    if (auto refused = wrong_method({"POST"})) return *refused;
    return json_response(path == "/loom/kv/probe"  ? kv_probe_body(kv_routes, request.body)
                         : path == "/loom/kv/send" ? kv_send_body(kv_routes, request.body)
                                                   : kv_reserve_body(kv_routes, request.body));
  }
  // As in vLLM, the runtime adapter routes exist only when enabled (404 otherwise).
  if (config.allow_runtime_lora && path == "/v1/load_lora_adapter") {
    if (auto refused = wrong_method({"POST"})) return *refused;
    return handle_load_adapter(request);
  }
  if (config.allow_runtime_lora && path == "/v1/unload_lora_adapter") {
    if (auto refused = wrong_method({"POST"})) return *refused;
    return handle_unload_adapter(request);
  }
  if (auto id = workflow_id(path, "/progress")) {
    if (auto refused = wrong_method({"POST"})) return *refused;
    return json_response(post_workflow_progress(engine, *id, request.body));
  }
  if (auto id = workflow_id(path, "")) {
    if (auto refused = wrong_method({"GET", "PUT", "DELETE"})) return *refused;
    if (method == "PUT") return json_response(put_workflow(engine, *id, request.body));
    if (method == "GET") return json_response(get_workflow(engine, *id));
    return json_response(delete_workflow(engine, *id));
  }
  throw ApiError(404, fmt::format("no route {} {}", method, path), "invalid_request_error", "", "not_found");
}

HttpResponse HttpServer::Impl::handle_models(const std::string* only) {
  const int64_t created = started_unix;
  const int32_t max_model_len = engine.max_context_tokens();
  Json data = Json::array();
  for (const std::string& name : config.served_model_names)  // as vLLM lists every --served-model-name
    data.push_back({{"id", name},
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
                    {"parent", config.served_model_name()},
                    {"max_model_len", max_model_len},
                    {"kv_sharing", kv_sharing_name(adapter.sharing)}});
  if (!only) return json_response(dump_json(Json{{"object", "list"}, {"data", data}}));
  for (const Json& model : data)
    if (model["id"] == *only) return json_response(dump_json(model));
  throw ApiError(404, fmt::format("The model '{}' does not exist.", *only), "invalid_request_error", "model",
                 "model_not_found");
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

HttpResponse HttpServer::Impl::handle_load_adapter(const HttpRequest& request) {
  const Json body = parse_json_object_body(request.body);
  const std::string name = required_string(body, "lora_name");
  const std::string path = checked_lora_path(required_string(body, "lora_path"));
  std::optional<KvSharing> sharing;  // absent or null: the adapter's own choice (choose_kv_sharing)
  if (body.contains("kv_sharing") && !body["kv_sharing"].is_null()) {
    const Json& value = body["kv_sharing"];
    if (value.is_string()) sharing = parse_kv_sharing(value.get<std::string>());
    if (!sharing)
      throw_bad_request("kv_sharing", fmt::format("'kv_sharing' must be one of \"isolated\", \"activated\", "
                                                  "\"base\", \"forked\" (got {})",
                                                  dump_json(value)));
  }
  std::lock_guard lock(adapter_mutex);
  for (const std::string& base_name : completion.parse.base_model_names)
    if (name == base_name)
      throw_bad_request("lora_name", fmt::format("'{}' names the base model (--served-model-name or --model); "
                                                 "an adapter needs a name of its own",
                                                 name));
  if (completion.parse.has_adapter(name))
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
  return text_response(fmt::format("Success: LoRA adapter '{}' added successfully.", name));
}

HttpResponse HttpServer::Impl::handle_unload_adapter(const HttpRequest& request) {
  const Json body = parse_json_object_body(request.body);
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
  return text_response(fmt::format("Success: LoRA adapter '{}' removed successfully.", name));
}

HttpServer::HttpServer(Engine& engine, ServerConfig config)
    : impl_(std::make_unique<Impl>(engine, std::move(config), stopping_, ending_requests_)) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::bind() { impl_->transport->bind(); }

std::optional<std::string> HttpServer::stats_line(double elapsed_seconds) {
  return impl_->metrics.stats_line(impl_->engine, elapsed_seconds);
}

int HttpServer::bound_port() const { return impl_->transport->bound_port(); }

int HttpServer::num_connections() const { return impl_->transport->num_connections(); }

void HttpServer::run() { impl_->transport->run(); }

bool HttpServer::shutdown(std::chrono::milliseconds timeout) {
  stopping_ = true;
  impl_->transport->stop_accepting();
  const bool drained = impl_->transport->wait_for_handlers(timeout);
  if (!drained) {
    spdlog::warn("shutdown: {} request(s) still running after {} ms: ending them", impl_->transport->num_handling(),
                 timeout.count());
    ending_requests_ = true;  // handlers cancel their engine requests and answer 503 / an SSE error
    impl_->transport->wait_for_handlers(std::chrono::seconds(5));
  }
  impl_->transport->stop();
  return drained;
}

void HttpServer::stop() {
  stopping_ = true;
  ending_requests_ = true;
  impl_->transport->stop();
}

}  // namespace loom::server
