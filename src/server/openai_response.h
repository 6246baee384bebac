// OpenAI response bodies for /v1/completions and /v1/chat/completions: whole
// responses and SSE stream chunks ("data: {...}\n\n"), logprobs in OpenAI's
// shapes for each endpoint. Pure functions of engine outputs; no I/O.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/openai_request.h"
#include "tokenizer/tokenizer.h"

namespace loom::server {

// Everything one choice produced so far.
struct ChoiceResult {
  std::string text;
  std::vector<SampledToken> tokens;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kLength;
  int32_t num_output_tokens = 0;
};

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0;
};

// Builds the bodies of one request. Borrows the request and tokenizer, which
// must outlive it. One per HTTP request; not thread-safe.
class ResponseBuilder {
 public:
  ResponseBuilder(const ParsedRequest& request, const Tokenizer& tokenizer, std::string id, int64_t created_unix);

  const std::string& id() const { return id_; }

  // Non-streaming body (choices in index order).
  std::string full_body(const std::vector<ChoiceResult>& choices, const Usage& usage) const;

  // SSE events. role_event: chat's first chunk for a choice (role + empty content).
  std::string role_event(int32_t index) const;
  // A delta: the output's text and (when requested) its tokens' logprobs;
  // finish_reason when the output finished the choice.
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
  // completions echo: the prompt text choice `index` starts with ("" without echo).
  std::string echo_text(int32_t index) const;

  std::vector<int64_t> text_offsets_;  // completions logprobs text_offset, per choice
  std::vector<bool> echoed_;           // streaming: the choice's echo text went out
};

// "cmpl-..." / "chatcmpl-..." with a random hex suffix.
std::string make_response_id(Endpoint endpoint);

}  // namespace loom::server
