// Parsing and validation of /v1/completions and /v1/chat/completions bodies
// into native types. Runs on HTTP worker threads: it also tokenizes, so the
// engine receives token ids only. Every problem throws ApiError (400 for bad
// fields, 404 for an unknown model) naming the offending field.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat/chat_renderer.h"
#include "engine/engine.h"
#include "grammar/constraint_compiler.h"
#include "reasoning/reasoning_parser.h"
#include "server/generation_defaults.h"
#include "server/tool_choice.h"
#include "tokenizer/tokenizer.h"

namespace loom::server {

enum class Endpoint { kCompletions, kChatCompletions };

// Logprobs as requested: completions `logprobs: k` (k >= 0 alternatives),
// chat `logprobs: true` + `top_logprobs: k`.
struct LogprobsRequest {
  bool enabled = false;
  int32_t num_top = 0;
  bool as_token_ids = false;  // vLLM's return_tokens_as_token_ids: tokens named "token_id:<id>"
};

// Per-request bounds on what a client may ask for (memory and work a single
// request can claim). Each has a `loom serve` flag; defaults documented there.
struct RequestLimits {
  int32_t max_n = 16;                         // --max-n: largest `n`
  int32_t max_stop_strings = 16;              // --max-stop-strings: entries in `stop`
  int32_t max_stop_string_bytes = 1024;       // --max-stop-string-bytes: bytes of one stop string
  int64_t max_request_output_tokens = 131072; // --max-request-output-tokens: choices x max_tokens
};

// What the parser needs to know about the server. Borrowed, not owned.
struct ParseContext {
  const Tokenizer* tokenizer = nullptr;
  // Renders chat prompts (the model's template or --chat-template). Null: one
  // is built from the tokenizer for each chat request (tests; the server sets it).
  const ChatRenderer* chat_renderer = nullptr;
  std::vector<std::string> base_model_names;  // names that mean the base model (first = canonical)
  std::function<bool(const std::string&)> has_adapter;  // adapter loaded under this name?
  int32_t max_context_tokens = 0;
  RequestLimits limits;
  // Compiles structured-output constraints (shared by the handler threads;
  // null: one is built from `tokenizer` per request that needs it).
  std::shared_ptr<grammar::ConstraintCompiler> constraints;
  toolcall::ParserKind tool_call_parser = toolcall::ParserKind::kNone;  // resolved --tool-call-parser
  reasoning::ReasoningKind reasoning_parser = reasoning::ReasoningKind::kNone;  // --reasoning-parser
  // Whether the served chat template reads `tools` (a request's own
  // chat_template is checked by itself); see check_auto_tool_choice.
  bool chat_template_renders_tools = true;
  // The seed of a request that gives none (thread-safe); null: a random one.
  std::function<uint64_t()> next_default_seed;
  // What a request that omits a sampling field gets (--generation-config).
  SamplingDefaults sampling_defaults;
};

// How a chat request's output splits into reasoning and answer (--reasoning-parser;
// reasoning/reasoning_parser.h). Inactive for completions and without the flag.
struct ReasoningSetup {
  reasoning::ReasoningKind kind = reasoning::ReasoningKind::kNone;
  bool starts_in_answer = true;  // the prompt closed the thinking (enable_thinking false)

  bool active() const { return kind != reasoning::ReasoningKind::kNone; }
};

// One parsed request. `prompts` holds one token list per prompt (a completions
// list prompt gives several); each prompt yields `n` choices, indexed
// prompt_index * n + sample_index as OpenAI does.
struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;    // as the client named it (echoed in responses)
  std::string adapter;  // "" = base model
  std::vector<std::vector<TokenId>> prompts;
  // chat: the validated `tools` list (already rendered into the prompt by the
  // chat template); empty when none.
  nlohmann::json tools = nlohmann::json::array();
  int32_t n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  LogprobsRequest logprobs;
  // completions `echo`: per prompt, the text its choices start with (the prompt
  // string as sent, or a token-id prompt decoded); empty without echo.
  std::vector<std::string> echo_texts;
  ToolChoice tool_choice;  // chat: tools / tool_choice (server/tool_choice.h); mode kNone otherwise
  // Chat with --reasoning-parser: tool calls and structured output are read
  // from the answer only; a constraint starts after the thinking
  // (EngineRequest::constraint_after) unless the output starts in the answer.
  ReasoningSetup reasoning;
  // JSON-schema keywords of the constraint that no grammar enforces (a
  // lenient schema), each once, in schema order: the x-loom-schema-unenforced header.
  std::vector<std::string> unenforced_schema_keywords;
  // Template for each engine request (prompt_tokens left empty); max_new_tokens
  // already resolved against the context and the endpoint's default.
  EngineRequest engine_template;

  int32_t num_choices() const { return static_cast<int32_t>(prompts.size()) * n; }
  // The engine request for choice `index` (seed + sample index when seeded).
  EngineRequest engine_request(int32_t choice_index) const;
};

// Parses a raw body. Throws ApiError.
ParsedRequest parse_openai_request(Endpoint endpoint, std::string_view body, const ParseContext& context);

// The adapter a request's `model` names ("" = the base model, also for an
// empty name). Throws ApiError(404, code model_not_found) for an unknown name.
std::string resolve_adapter(const std::string& model, const ParseContext& context);
// A boolean field of `object`: `fallback` when absent or null. Throws ApiError(400)
// naming `key` for another type.
bool read_bool(const nlohmann::json& object, const char* key, bool fallback);
// A JSON list of token ids, each in [0, vocab_size). Throws ApiError(400)
// naming `param` (or its bad element).
std::vector<TokenId> read_token_ids(const nlohmann::json& list, const std::string& param, int vocab_size);

}  // namespace loom::server
