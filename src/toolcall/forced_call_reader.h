// The calls of a forced output (tool_choice "required" or a named function),
// streamed as the constrained JSON is generated (forced_calls.h has the shapes):
//
//   required: [{"name": "f", "parameters": {...}}, ...]
//   named:    {...}   (the arguments of that function)
//
// A call's first delta (index, id, name, "" arguments) goes out as soon as its
// name is known, then its arguments text piece by piece, exactly as written
// (the grammar writes compact JSON), so the deltas concatenate to the
// whole-text result for any way of cutting the text (read_forced_output is
// that whole-text result, by definition).
//
// An output cut short (max_tokens, a stop string) is still calls: the calls
// whose name was written, the last with its arguments as far as they got. An
// output whose first non-space byte is not the forced opener ('[' / '{') was
// not constrained: it is content. Structure only is followed (strings,
// escapes, brackets); validity is the grammar's job. Never throws on any text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "toolcall/tool_call.h"

namespace loom::toolcall {

class ForcedCallReader {
 public:
  // `named_function` empty: "required" (a list of calls); else the named function.
  ForcedCallReader(std::string named_function, uint64_t id_seed);

  StreamDelta feed(std::string_view text);
  // Call once, last.
  StreamDelta finish(std::string_view last_text = {});

 private:
  enum class Mode { kUndecided, kCalls, kContent };
  void scan(StreamDelta& delta);
  // Releases what the current call has that was not sent: its first delta, new arguments text.
  void release_call(StreamDelta& delta, size_t scanned_end);
  void close_string(size_t end);
  void begin_element();

  std::string named_;
  CallIdGenerator ids_;
  std::string text_;
  size_t position_ = 0;  // next byte to scan
  size_t content_sent_ = 0;
  Mode mode_ = Mode::kUndecided;
  bool finished_ = false;
  bool done_ = false;  // the top-level value closed; the rest is ignored

  std::string open_;  // open brackets, outermost first
  bool in_string_ = false, escaped_ = false;
  size_t string_start_ = 0;

  // The call being read ("required": one list element; named: the whole value).
  int32_t index_ = -1;
  std::optional<std::string> name_;
  bool expect_key_ = false;     // "required", at the element's level
  bool value_pending_ = false;  // after ':' at the element's level, before the value
  std::string key_;
  size_t args_start_ = std::string::npos, args_end_ = std::string::npos;
  size_t args_sent_ = 0;  // arguments text released up to here
  bool call_sent_ = false;
};

// The whole output at once: what the stream's deltas add up to.
ParsedOutput read_forced_output(const std::string& named_function, std::string_view text, uint64_t id_seed);

}  // namespace loom::toolcall
