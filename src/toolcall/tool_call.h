// Tool calls in a model's generated text: which convention a model uses, and
// the plain types both parsers (whole text, tool_call_parser.h; streamed,
// the same header) return. Pure data, no server types; any thread.
//
// Conventions (`--tool-call-parser`):
//   hermes       Hermes, Qwen2.5, Qwen3: text, then one or more
//                <tool_call>{"name": "f", "arguments": {...}}</tool_call>
//   llama3_json  Llama-3.1/3.2/3.3: the output IS the calls, JSON objects
//                {"name": "f", "parameters": {...}} separated by ';', optionally
//                after <|python_tag|>
//   mistral      [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...] (v3), and
//                [TOOL_CALLS]f[ARGS]{...} (v11+, repeated for several calls)
//   none         no parsing: the text is content
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/prng.h"

namespace loom::toolcall {

enum class ParserKind { kNone, kHermes, kLlama3Json, kMistral };

// "none", "hermes", "llama3_json", "mistral".
const char* parser_name(ParserKind kind);
// The kind named by `name`, or nullopt for an unknown name ("auto" is not a
// kind: resolve it with detect_parser).
std::optional<ParserKind> parser_from_name(std::string_view name);
// The convention a Jinja chat template's source text writes tool calls in:
// "<tool_call>" -> hermes, "[TOOL_CALLS]" -> mistral, "<|python_tag|>" or the
// Llama-3 header "<|start_header_id|>" -> llama3_json; anything else -> none.
ParserKind detect_parser(std::string_view chat_template_source);

// One call as OpenAI returns it. `arguments` is JSON text of an object
// (compact, UTF-8 kept as is), never malformed.
struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;

  bool operator==(const ToolCall&) const = default;
};

// What a whole output means: the text that is not a call, and the calls in order.
struct ParsedOutput {
  std::string content;
  std::vector<ToolCall> tool_calls;
};

// One piece of a streamed call, in OpenAI's delta shape: the first delta of
// call `index` has `id` and `name` set and empty `arguments`; later deltas
// have only `arguments` (fragments that concatenate to the call's arguments).
struct ToolCallDelta {
  int32_t index = 0;
  std::string id;    // first delta of a call only
  std::string name;  // first delta of a call only
  std::string arguments;

  bool is_first() const { return !id.empty(); }
};

// What one fed piece of text released. Each channel is in text order; when one
// piece releases both, their relative order is not kept (OpenAI's delta holds
// content and tool_calls side by side).
struct StreamDelta {
  std::string content;
  std::vector<ToolCallDelta> tool_calls;

  bool empty() const { return content.empty() && tool_calls.empty(); }
};

// The whole output a reader released at once: content as is, each call's
// argument fragments joined.
ParsedOutput assemble_output(StreamDelta delta);

// Call ids: "call_" + 24 random alphanumerics (OpenAI's shape), or exactly 9
// alphanumerics for Mistral (its chat templates refuse any other length when
// the call comes back in the history). Seeded, so a whole-text and a streamed
// parse with one seed give the same ids (tests, the fuzzer).
class CallIdGenerator {
 public:
  CallIdGenerator(ParserKind kind, uint64_t seed) : mistral_(kind == ParserKind::kMistral), prng_(seed) {}
  std::string next();

 private:
  bool mistral_;
  Prng prng_;
};

}  // namespace loom::toolcall
