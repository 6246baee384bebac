// Tool calls out of generated text, whole or streamed.
//
//   parse_tool_calls(kind, text, seed)        the whole output at once
//   ToolCallParser(kind, seed).feed(...)...   the same output piece by piece,
//                                             then finish()
//
// Both run one step machine per convention (call_formats.h), so for any text
// and any way of cutting it into pieces the streamed content deltas
// concatenate to the whole-text content and the streamed calls (ids included,
// for one seed) are the whole-text calls. What a convention's grammar does not
// accept (bad JSON, a call without a name, an unterminated call) is content;
// nothing here throws on any input.
//
// Streaming holds back what may still turn out to be part of a call: a
// possible marker prefix, the whitespace before it, and a call until it is
// complete and valid. A call is then released as two deltas: id + name, then
// the whole arguments (so a call that turns out malformed was never sent).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "toolcall/tool_call.h"

namespace loom::toolcall {

class CallFormat;

ParsedOutput parse_tool_calls(ParserKind kind, std::string_view text, uint64_t id_seed);

// One output's incremental parse. Not thread-safe; one per choice.
class ToolCallParser {
 public:
  ToolCallParser(ParserKind kind, uint64_t id_seed);
  ~ToolCallParser();
  ToolCallParser(ToolCallParser&&) noexcept;
  ToolCallParser& operator=(ToolCallParser&&) noexcept;

  // The next piece of generated text (may end inside a marker or a call).
  StreamDelta feed(std::string_view text);
  // The output ended with `last_text`: everything still held back is decided.
  // Call once, last (feed() after it is an invariant failure).
  StreamDelta finish(std::string_view last_text = {});

  // Whether any call was released so far (after finish(): in the whole output).
  bool has_tool_calls() const { return num_calls_ > 0; }

 private:
  StreamDelta run(bool at_end);

  std::unique_ptr<CallFormat> format_;
  CallIdGenerator ids_;
  std::string text_;     // everything fed so far
  size_t position_ = 0;  // text_[0, position_) is decided
  int32_t num_calls_ = 0;
  bool finished_ = false;
};

}  // namespace loom::toolcall
