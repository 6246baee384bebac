#include "server/completion_handler.h"

#include <chrono>
#include <ctime>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include <spdlog/spdlog.h>

#include "server/api_error.h"
#include "server/openai_response.h"

namespace loom::server {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A stream silent this long gets an SSE comment, so a vanished client is noticed.
constexpr auto kKeepAliveInterval = std::chrono::seconds(2);

// One HTTP request's engine streams and what they produced. Shared between the
// handler and the chunked content provider, which outlives the handler call.
struct Generation {
  ParsedRequest request;
  std::unique_ptr<ResponseBuilder> builder;
  std::vector<std::unique_ptr<RequestStream>> streams;  // one per choice
  std::vector<ChoiceResult> results;
  std::optional<Error> error;  // the first failure reported by a stream
  int32_t num_unfinished = 0;
  Clock::time_point started = Clock::now();
  std::optional<Clock::time_point> first_token_at;

  ~Generation() {
    for (auto& stream : streams) stream->cancel();  // no-op for finished ones
  }

  Usage usage() const {
    Usage usage;
    for (const auto& prompt : request.prompts) usage.prompt_tokens += static_cast<int64_t>(prompt.size());
    for (const auto& result : results) usage.completion_tokens += result.num_output_tokens;
    // Each prompt counts once, as its tokens do: its first choice's cache hits.
    for (size_t prompt = 0; prompt < request.prompts.size(); ++prompt)
      usage.cached_tokens += results[prompt * static_cast<size_t>(request.n)].num_cached_prompt_tokens;
    return usage;
  }

  void record(int32_t index, const RequestOutput& output) {
    ChoiceResult& result = results[static_cast<size_t>(index)];
    if (!first_token_at && !output.new_tokens.empty()) first_token_at = Clock::now();
    result.text += output.text_delta;
    result.tokens.insert(result.tokens.end(), output.new_tokens.begin(), output.new_tokens.end());
    result.num_output_tokens = std::max<int32_t>(output.num_output_tokens, static_cast<int32_t>(result.tokens.size()));
    result.num_cached_prompt_tokens = std::max(result.num_cached_prompt_tokens, output.num_cached_prompt_tokens);
    if (output.finished && !result.finished) {
      result.finished = true;
      result.finish_reason = output.finish_reason;
      --num_unfinished;
      if (output.error && !error) error = output.error;
    }
  }

  // Waits up to `timeout` for outputs of unfinished choices; returns (choice, output) pairs.
  std::vector<std::pair<int32_t, RequestOutput>> poll(milliseconds timeout) {
    std::vector<std::pair<int32_t, RequestOutput>> outputs;
    std::vector<int32_t> open;
    for (size_t i = 0; i < streams.size(); ++i)
      if (!results[i].finished) open.push_back(static_cast<int32_t>(i));
    if (open.size() == 1) {
      if (auto output = streams[open[0]]->next(timeout)) outputs.emplace_back(open[0], std::move(*output));
      return outputs;
    }
    const auto deadline = Clock::now() + timeout;
    do {
      for (int32_t index : open)
        while (auto output = streams[index]->next(milliseconds(0))) {
          const bool finished = output->finished;
          outputs.emplace_back(index, std::move(*output));
          if (finished) break;
        }
      if (!outputs.empty()) break;
      std::this_thread::sleep_for(milliseconds(2));
    } while (Clock::now() < deadline);
    return outputs;
  }

  void cancel_all() {
    for (auto& stream : streams) stream->cancel();
  }
};

std::shared_ptr<Generation> submit_all(Endpoint endpoint, const CompletionContext& context, ParsedRequest parsed) {
  auto generation = std::make_shared<Generation>();
  generation->request = std::move(parsed);
  const int32_t num_choices = generation->request.num_choices();
  generation->builder = std::make_unique<ResponseBuilder>(generation->request, *context.tokenizer,
                                                         make_response_id(endpoint), std::time(nullptr),
                                                         context.system_fingerprint);
  generation->results.resize(static_cast<size_t>(num_choices));
  generation->num_unfinished = num_choices;
  for (int32_t index = 0; index < num_choices; ++index) {
    try {
      generation->streams.push_back(context.engine->submit(generation->request.engine_request(index)));
    } catch (const Error& error) {
      generation->cancel_all();  // the destructor would too; be explicit about partial submits
      throw api_error_from(error, error.kind() == ErrorKind::kNotFound ? "model" : "");
    }
  }
  return generation;
}

// One line per finished request (vLLM logs each request too; --disable-log-requests: none).
void log_finished(const CompletionContext& context, const Generation& generation, std::string_view status) {
  if (!context.log_requests) return;
  const Usage usage = generation.usage();
  std::string finish;
  for (const ChoiceResult& result : generation.results) {
    if (!finish.empty()) finish += ',';
    finish += result.finished ? finish_reason_name(result.finish_reason) : "-";
  }
  const auto seconds = [&](Clock::time_point at) { return std::chrono::duration<double>(at - generation.started).count(); };
  spdlog::info("request {} model={} adapter={} status={} finish={} prompt={} cached={} output={} ttft={} total={:.3f}s{}",
               generation.builder->id(), generation.request.model,
               generation.request.adapter.empty() ? "-" : generation.request.adapter, status, finish,
               usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens,
               generation.first_token_at ? fmt::format("{:.3f}s", seconds(*generation.first_token_at)) : "-",
               seconds(Clock::now()), generation.error ? fmt::format(" error=\"{}\"", generation.error->what()) : "");
}

ApiError shutting_down() {
  return ApiError(503, "the server is shutting down", "server_error", "", "server_shutting_down");
}

HttpResponse respond_whole(const CompletionContext& context, Generation& generation, const HttpRequest& request) {
  while (generation.num_unfinished > 0) {
    auto outputs = generation.poll(milliseconds(100));
    for (auto& [index, output] : outputs) generation.record(index, output);
    if (context.ending_requests->load()) {
      generation.cancel_all();
      log_finished(context, generation, "503");
      throw shutting_down();
    }
    if (request.client_gone()) {
      spdlog::debug("client left request {}: cancelling", generation.builder->id());
      generation.cancel_all();
      log_finished(context, generation, "cancelled");
      HttpResponse response;
      response.abandon = true;
      return response;
    }
  }
  if (generation.error) {
    const ApiError error = api_error_from(*generation.error);
    log_finished(context, generation, std::to_string(error.status()));
    throw error;
  }
  log_finished(context, generation, "200");
  HttpResponse response;
  response.body = generation.builder->full_body(generation.results, generation.usage());
  return response;
}

// Writes every event of the stream, then [DONE]; stops early when the client leaves.
void write_stream(const CompletionContext& context, Generation& generation, ResponseSink& sink) {
  auto write = [&](const std::string& event) { return sink.write(event); };
  auto client_left = [&] {
    spdlog::debug("client left stream {}: cancelling", generation.builder->id());
    generation.cancel_all();
    log_finished(context, generation, "cancelled");
  };
  const bool is_chat = generation.request.endpoint == Endpoint::kChatCompletions;
  if (is_chat)
    for (int32_t index = 0; index < generation.request.num_choices(); ++index)
      if (!write(generation.builder->role_event(index))) return client_left();

  auto last_write = Clock::now();
  while (generation.num_unfinished > 0) {
    auto outputs = generation.poll(milliseconds(100));
    for (auto& [index, output] : outputs) {
      generation.record(index, output);
      const std::string event = output.error
                                    ? ResponseBuilder::error_event(api_error_from(*output.error).body())
                                    : generation.builder->delta_event(index, output);
      if (event.empty()) continue;  // held back (a tool call in the making)
      if (!write(event)) return client_left();
      last_write = Clock::now();
    }
    if (outputs.empty() && Clock::now() - last_write > kKeepAliveInterval) {
      if (!write(": keep-alive\n\n")) return client_left();
      last_write = Clock::now();
    }
    if (context.ending_requests->load()) {
      generation.cancel_all();
      write(ResponseBuilder::error_event(shutting_down().body()));
      write(ResponseBuilder::done_event());
      log_finished(context, generation, "503");
      return;
    }
  }
  if (generation.request.include_usage && !write(generation.builder->usage_event(generation.usage())))
    return client_left();
  write(ResponseBuilder::done_event());
  log_finished(context, generation, generation.error ? "200 (stream error)" : "200");
}

// Each unenforced keyword is logged once per process (a client sending one
// schema with every request must not flood the log).
void log_unenforced_once(const std::vector<std::string>& keywords) {
  static std::mutex mutex;
  static std::set<std::string> logged;
  std::lock_guard lock(mutex);
  for (const std::string& keyword : keywords)
    if (logged.insert(keyword).second)
      spdlog::warn("JSON schema keyword '{}' is served unenforced (no grammar here can enforce it; the request "
                   "did not say \"strict\": true); such responses carry the header {}",
                   keyword, kSchemaUnenforcedHeader);
}

}  // namespace

HttpResponse handle_completion(Endpoint endpoint, const CompletionContext& context, const HttpRequest& request) {
  ParsedRequest parsed = parse_openai_request(endpoint, request.body, context.parse);
  const bool stream = parsed.stream;
  std::string unenforced;
  for (const std::string& keyword : parsed.unenforced_schema_keywords) unenforced += (unenforced.empty() ? "" : ", ") + keyword;
  log_unenforced_once(parsed.unenforced_schema_keywords);
  std::shared_ptr<Generation> generation = submit_all(endpoint, context, std::move(parsed));
  HttpResponse response;
  if (!stream) response = respond_whole(context, *generation, request);
  if (!unenforced.empty()) response.headers.emplace_back(kSchemaUnenforcedHeader, unenforced);
  if (!stream) return response;
  response.content_type = "text/event-stream";
  response.headers.emplace_back("Cache-Control", "no-cache");
  response.stream = [context, generation](ResponseSink& sink) { write_stream(context, *generation, sink); };
  return response;
}

}  // namespace loom::server
