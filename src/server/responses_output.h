// /v1/responses output: the response object (OpenAI's Response: output items,
// status, usage with cached tokens, the request's settings echoed) and the
// streamed event sequence, from one chat choice's engine outputs. Tool calls
// are read as on /v1/chat/completions (server/openai_response.h's
// read_tool_calls / ToolCallReader); each becomes a function_call item
// {id: "fc_...", call_id, name, arguments}; the text a message item
// {id: "msg_...", role: assistant, content: [{type: output_text, text, annotations: []}]},
// before the calls. No text and no calls: one message with empty text. With
// a reasoning parser the thinking comes first as a reasoning item
// {id: "rs_...", summary: [], content: [{type: reasoning_text, text}]} (then
// no empty message is added), and calls are read from the answer only.
//
// Status: "completed", or "incomplete" with incomplete_details.reason
// "max_output_tokens" when the output hit its token limit; the last item is
// then "incomplete" too (a function_call with its partial arguments, never
// text). Forced calls stream their arguments as they are generated.
//
// Stream (SSE "event: TYPE\ndata: {...}\n\n", sequence_number counting from 0):
//   response.created, response.in_progress,
//   per message: response.output_item.added, response.content_part.added,
//     response.output_text.delta..., response.output_text.done, response.content_part.done,
//     response.output_item.done
//   per reasoning item: response.output_item.added, response.reasoning_text.delta...,
//     response.reasoning_text.done, response.output_item.done
//   per call: response.output_item.added, response.function_call_arguments.delta...,
//     response.function_call_arguments.done, response.output_item.done
//   response.completed (or response.incomplete), carrying the whole response.
// Not thread-safe; one per request.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "server/openai_request.h"
#include "server/openai_response.h"
#include "reasoning/reasoning_parser.h"
#include "server/responses_request.h"

namespace loom::server {

class ResponsesOutput {
 public:
  // Borrows `parsed` (its tool_choice), which must outlive this.
  ResponsesOutput(const ResponsesRequest& request, const ParsedRequest& parsed, std::string id, int64_t created_at);

  const std::string& id() const { return id_; }

  // The response of a finished choice (whole bodies).
  nlohmann::json finished_response(const ChoiceResult& result, const Usage& usage) const;

  // Streaming: the opening events; then the events of each engine output
  // ("" when there is nothing to send yet); then the closing ones.
  std::string start_events();
  std::string output_events(const RequestOutput& output);
  std::string finish_events(FinishReason reason, const Usage& usage);
  // An error inside a stream (OpenAI's "error" event).
  std::string error_event(const std::string& code, const std::string& message);
  // The response as the stream ended it (after finish_events).
  const nlohmann::json& streamed_response() const { return streamed_; }

 private:
  nlohmann::json head(const char* status) const;
  std::string event(const char* type, nlohmann::json fields);
  std::string open_message();
  std::string open_reasoning();
  // The answer part of an output (all of it without a reasoning parser).
  std::string answer_events(const RequestOutput& output);
  std::string close_open_item(bool incomplete);

  const ParsedRequest& parsed_;
  std::string id_;
  int64_t created_at_;
  nlohmann::json echoed_;  // the request's settings every response repeats
  uint64_t id_seed_;

  // Streaming state.
  std::unique_ptr<ToolCallReader> reader_;  // when the output is read for tool calls
  std::optional<reasoning::ReasoningSplitter> splitter_;  // with a reasoning parser
  int64_t sequence_ = 0;
  nlohmann::json output_ = nlohmann::json::array();  // finished items
  enum class Open { kNone, kMessage, kCall, kReasoning } open_ = Open::kNone;
  nlohmann::json item_;         // the open item
  std::string text_;            // the open message's (or reasoning item's) text
  int32_t call_index_ = -1;     // the open call's parser index
  nlohmann::json streamed_;
};

// "resp_" and 32 hex digits (ids of items: "msg_" / "fc_" and 32).
std::string make_responses_id(const char* prefix = "resp");

}  // namespace loom::server
