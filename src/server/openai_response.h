// OpenAI response bodies for /v1/completions and /v1/chat/completions: whole
// responses and SSE stream chunks ("data: {...}\n\n"), logprobs in OpenAI's
// shapes for each endpoint. Pure functions of engine outputs; no I/O.
//
// Tool calls (chat, request.tool_choice.parses_output()): each choice's text
// is read for calls (server/tool_choice.h says how per tool_choice). Whole
// bodies get message.tool_calls, content null when nothing else was said, and
// finish_reason "tool_calls" (a named tool_choice keeps "stop", as OpenAI; an
// output cut by max_tokens keeps "length", its last call partial). Streams get
// OpenAI's shape: a chunk with a call's first delta (index, id, type, name,
// arguments ""), chunks of argument deltas, and finish_reason in a chunk of its
// own (empty delta).
//
// Reasoning (chat, request.reasoning active): each choice's text is split
// first (reasoning/reasoning_parser.h); the thinking goes to message
// `reasoning_content` and `reasoning` (vLLM's old and new names; null when
// none), the answer to `content` (null when empty), and tool calls are read
// from the answer only. Streams send the thinking as deltas of both fields in
// chunks of their own, then the answer as above.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "reasoning/reasoning_parser.h"
#include "server/openai_request.h"
#include "tokenizer/tokenizer.h"
#include "toolcall/forced_call_reader.h"
#include "toolcall/tool_call_parser.h"

namespace loom::server {

// Everything one choice produced so far.
struct ChoiceResult {
  std::string text;
  std::vector<SampledToken> tokens;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kLength;
  int32_t num_output_tokens = 0;
  int32_t num_cached_prompt_tokens = 0;  // of its prompt, served from the prefix cache
  // Of num_output_tokens, those of the thinking (a reasoning parser): every token of an engine output
  // that came while the text so far had not left the reasoning, the one closing it (</think>) included.
  int32_t num_reasoning_tokens = 0;
};

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens served from the prefix cache (prompt_tokens_details)
  // Completion tokens of the thinking, with a reasoning parser (chat: completion_tokens_details,
  // Responses: output_tokens_details); part of completion_tokens.
  int64_t reasoning_tokens = 0;
};

// A choice's whole text read for tool calls as `choice` says: auto through
// its parser; required / named as the forced JSON (a call cut short by
// max_tokens is returned with its partial arguments; content only when the
// output is no forced JSON at all).
// parallel_tool_calls false keeps the first call only.
toolcall::ParsedOutput read_tool_calls(const ToolChoice& choice, const std::string& text, uint64_t id_seed);

// One choice's output read for tool calls as it streams: under auto, content
// and call deltas as the parser releases them (a call once it is complete);
// required / named: each call's first delta as soon as its name is written,
// then its arguments as they are generated (toolcall/forced_call_reader.h).
// Borrows `choice`. Not thread-safe.
class ToolCallReader {
 public:
  ToolCallReader(const ToolChoice& choice, uint64_t id_seed);
  toolcall::StreamDelta next(const RequestOutput& output);

 private:
  const ToolChoice& choice_;
  std::optional<toolcall::ToolCallParser> parser_;    // auto
  std::optional<toolcall::ForcedCallReader> forced_;  // required / named
};

// Builds the bodies of one request. Borrows the request and tokenizer, which
// must outlive it. One per HTTP request; not thread-safe.
class ResponseBuilder {
 public:
  // A non-empty system_fingerprint goes into every body and chunk (OpenAI's field).
  ResponseBuilder(const ParsedRequest& request, const Tokenizer& tokenizer, std::string id, int64_t created_unix,
                  std::string system_fingerprint = {});

  const std::string& id() const { return id_; }

  // Non-streaming body (choices in index order).
  std::string full_body(const std::vector<ChoiceResult>& choices, const Usage& usage) const;

  // SSE events. role_event: chat's first chunk for a choice (role + empty content).
  std::string role_event(int32_t index) const;
  // A delta: the output's text and (when requested) its tokens' logprobs;
  // finish_reason when the output finished the choice. "" when there is
  // nothing to send yet (text held back by the tool-call parser). With tool
  // calls parsed, several chunks (see the top of this file).
  std::string delta_event(int32_t index, const RequestOutput& output);
  // The final usage chunk (choices: []), for stream_options.include_usage.
  std::string usage_event(const Usage& usage) const;
  // An error inside a stream (the status line is already sent).
  static std::string error_event(const std::string& body_json);
  static std::string done_event() { return "data: [DONE]\n\n"; }

 private:
  const ParsedRequest& request_;
  const Tokenizer& tokenizer_;
  std::string id_;
  int64_t created_;
  std::string system_fingerprint_;
  // The fields every body and chunk starts with.
  nlohmann::json head(const char* object) const;
  // One chat chunk of choice `index`.
  std::string chunk(int32_t index, nlohmann::json delta, nlohmann::json logprobs, const char* finish_reason) const;
  // delta_event when the choice's output is read for tool calls.
  std::string tool_call_events(int32_t index, const RequestOutput& output);
  // delta_event of the answer (all of the output without a reasoning parser).
  std::string answer_events(int32_t index, const RequestOutput& output);
  // delta_event with a reasoning parser: the thinking's chunk, then answer_events.
  std::string reasoning_events(int32_t index, const RequestOutput& output);
  // completions echo: the prompt text choice `index` starts with ("" without echo).
  std::string echo_text(int32_t index) const;

  std::vector<int64_t> text_offsets_;  // completions logprobs text_offset, per choice
  std::vector<bool> echoed_;           // streaming: the choice's echo text went out

  // Tool calls, per choice (empty vectors when the request parses none).
  uint64_t tool_call_id_seed_ = 0;
  std::vector<std::unique_ptr<ToolCallReader>> tool_call_readers_;  // streaming
  std::vector<bool> sent_tool_calls_;  // streaming: a call went out
  std::vector<reasoning::ReasoningSplitter> reasoning_splitters_;  // streaming, per choice, with a reasoning parser
};

// "cmpl-..." / "chatcmpl-..." with a random hex suffix.
std::string make_response_id(Endpoint endpoint);

}  // namespace loom::server
