// The conventions as step machines over a growing text (internal to the
// module; tool_call_parser.cc drives them). A format is asked about the
// undecided rest of the text, text[position...], and answers with one step:
//
//   text:  | decided (content / calls) | position ... undecided ... | size
//   step:  kContent / kSkip / kCalls consume text[position, end), end > position;
//          kWait: nothing can be decided before more text comes (never at_end);
//          kRestate: the format changed its own mode, nothing consumed.
//
// The contract that makes a streamed parse equal the whole-text one: a step
// decided on a prefix of the text (at_end false) is one the whole text would
// also allow; anything that more text could change is a kWait. kSkip drops the
// whitespace that frames a call (before a call marker, after a call).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "toolcall/tool_call.h"

namespace loom::toolcall {

struct CallText {
  std::string name;
  std::string arguments;  // compact JSON object text
};

struct FormatStep {
  enum class Kind { kContent, kSkip, kCalls, kWait, kRestate };
  Kind kind = Kind::kWait;
  size_t end = 0;
  std::vector<CallText> calls;  // kCalls only, at least one

  static FormatStep content(size_t end) { return make(Kind::kContent, end); }
  static FormatStep skip(size_t end) { return make(Kind::kSkip, end); }
  static FormatStep wait() { return make(Kind::kWait, 0); }
  static FormatStep restate() { return make(Kind::kRestate, 0); }
  static FormatStep found_calls(size_t end, std::vector<CallText> calls) {
    FormatStep step = make(Kind::kCalls, end);
    step.calls = std::move(calls);
    return step;
  }

 private:
  static FormatStep make(Kind kind, size_t end) {
    FormatStep step;
    step.kind = kind;
    step.end = end;
    return step;
  }
};

class CallFormat {
 public:
  virtual ~CallFormat() = default;
  // Precondition: position < text.size(). `text` grows between calls (same prefix).
  virtual FormatStep step(std::string_view text, size_t position, bool at_end) = 0;
};

// kNone: everything is content.
std::unique_ptr<CallFormat> make_call_format(ParserKind kind);

}  // namespace loom::toolcall
