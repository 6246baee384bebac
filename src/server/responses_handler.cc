#include "server/responses_handler.h"

#include <chrono>
#include <ctime>
#include <memory>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "server/api_error.h"
#include "server/generation.h"
#include "server/json_output.h"
#include "server/responses_output.h"
#include "server/responses_request.h"

namespace loom::server {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr auto kKeepAliveInterval = std::chrono::seconds(2);

// The chat field an error names, as the Responses field it came from.
std::string responses_param(const std::string& param) {
  auto starts = [&](const char* prefix) { return param.rfind(prefix, 0) == 0; };
  if (param == "max_completion_tokens") return "max_output_tokens";
  if (starts("response_format")) return "text.format";
  if (starts("messages")) return "input";
  return param;
}

ApiError renamed(const ApiError& error) {
  return ApiError(error.status(), error.message(), error.type(), responses_param(error.param()), error.code());
}

// One POST's state, shared with the stream provider.
struct ResponsesCall {
  ResponsesRequest request;
  OrderedJson history;  // the previous response's conversation (items)
  std::shared_ptr<Generation> generation;
  std::unique_ptr<ResponsesOutput> output;
};

void store_response(const ResponsesContext& context, const ResponsesCall& call, const Json& response) {
  if (!call.request.store) return;
  auto entry = std::make_shared<StoredResponse>();
  entry->response = response;
  entry->conversation = call.history.is_array() ? call.history : OrderedJson::array();
  for (const OrderedJson& item : call.request.input_items) entry->conversation.push_back(item);
  for (const Json& item : response["output"]) entry->conversation.push_back(OrderedJson::parse(item.dump()));
  if (!context.store->put(call.output->id(), std::move(entry)))
    spdlog::debug("response {} not stored (larger than --responses-store-max-bytes, or the store is off)",
                  call.output->id());
}

void write_stream(const ResponsesContext& context, ResponsesCall& call, ResponseSink& sink) {
  Generation& generation = *call.generation;
  ResponsesOutput& output = *call.output;
  const bool log = context.completion->log_requests;
  auto client_left = [&] {
    spdlog::debug("client left stream {}: cancelling", output.id());
    generation.cancel_all();
    log_finished(log, generation, "cancelled");
  };
  if (!sink.write(output.start_events())) return client_left();
  auto last_write = Clock::now();
  while (generation.num_unfinished > 0) {
    auto outputs = generation.poll(milliseconds(100));
    for (auto& [index, engine_output] : outputs) {
      generation.record(index, engine_output);
      std::string events;
      if (engine_output.error) {
        const ApiError error = api_error_from(*engine_output.error);
        events = output.error_event(error.code().empty() ? error.type() : error.code(), error.message());
      } else {
        events = output.output_events(engine_output);
        if (engine_output.finished)
          events += output.finish_events(engine_output.finish_reason, generation.usage());
      }
      if (events.empty()) continue;
      if (!sink.write(events)) return client_left();
      last_write = Clock::now();
    }
    if (outputs.empty() && sink.client_gone()) return client_left();
    if (outputs.empty() && Clock::now() - last_write > kKeepAliveInterval) {
      if (!sink.write(": keep-alive\n\n")) return client_left();
      last_write = Clock::now();
    }
    if (context.completion->ending_requests->load()) {
      generation.cancel_all();
      sink.write(output.error_event("server_shutting_down", "the server is shutting down"));
      log_finished(log, generation, "503");
      return;
    }
  }
  if (!generation.error) store_response(context, call, output.streamed_response());
  log_finished(log, generation, generation.error ? "200 (stream error)" : "200");
}

}  // namespace

HttpResponse handle_create_response(const ResponsesContext& context, const HttpRequest& request) {
  const CompletionContext& completion = *context.completion;
  if (left_before_handling(request, completion.log_requests)) {
    HttpResponse abandoned;
    abandoned.abandon = true;
    return abandoned;
  }
  auto call = std::make_shared<ResponsesCall>();
  call->request = parse_responses_request(request.body);
  if (!call->request.previous_response_id.empty()) {
    auto previous = context.store->get(call->request.previous_response_id);
    if (!previous)
      throw ApiError(404,
                     fmt::format("Previous response with id '{}' not found.", call->request.previous_response_id),
                     "invalid_request_error", "previous_response_id", "previous_response_not_found");
    call->history = previous->conversation;
  }
  const std::string chat_body = to_chat_body(call->request, call->history).dump();
  ParsedRequest parsed;
  try {
    parsed = parse_openai_request(Endpoint::kChatCompletions, chat_body, completion.parse);
  } catch (const ApiError& error) {
    throw renamed(error);
  }
  const std::string unenforced = note_unenforced_keywords(parsed.unenforced_schema_keywords);
  const std::string id = make_responses_id();
  call->generation = submit_generation(*completion.engine, *completion.tokenizer, std::move(parsed), id,
                                       completion.system_fingerprint);
  call->output = std::make_unique<ResponsesOutput>(call->request, call->generation->request, id, std::time(nullptr));

  HttpResponse response;
  if (!unenforced.empty()) response.headers.emplace_back(kSchemaUnenforcedHeader, unenforced);
  if (call->request.stream) {
    response.content_type = "text/event-stream";
    response.headers.emplace_back("Cache-Control", "no-cache");
    response.stream = [context, call](ResponseSink& sink) { write_stream(context, *call, sink); };
    return response;
  }
  Generation& generation = *call->generation;
  if (!wait_for_generation(generation, *completion.ending_requests, request, completion.log_requests)) {
    response.abandon = true;
    return response;
  }
  const Json body = call->output->finished_response(generation.results.at(0), generation.usage());
  store_response(context, *call, body);
  response.body = dump_json(body);
  return response;
}

HttpResponse handle_get_response(const ResponsesContext& context, const std::string& id) {
  auto stored = context.store->get(id);
  if (!stored)
    throw ApiError(404, fmt::format("Response with id '{}' not found.", id), "invalid_request_error", "response_id",
                   "not_found");
  HttpResponse response;
  response.body = dump_json(stored->response);
  return response;
}

HttpResponse handle_delete_response(const ResponsesContext& context, const std::string& id) {
  if (!context.store->erase(id))
    throw ApiError(404, fmt::format("Response with id '{}' not found.", id), "invalid_request_error", "response_id",
                   "not_found");
  HttpResponse response;
  response.body = dump_json(Json{{"id", id}, {"object", "response"}, {"deleted", true}});
  return response;
}

}  // namespace loom::server
