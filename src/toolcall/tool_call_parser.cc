#include "toolcall/tool_call_parser.h"

#include "toolcall/call_formats.h"
#include "util/error.h"

namespace loom::toolcall {

ToolCallParser::ToolCallParser(ParserKind kind, uint64_t id_seed)
    : format_(make_call_format(kind)), ids_(kind, id_seed) {}
ToolCallParser::~ToolCallParser() = default;
ToolCallParser::ToolCallParser(ToolCallParser&&) noexcept = default;
ToolCallParser& ToolCallParser::operator=(ToolCallParser&&) noexcept = default;

StreamDelta ToolCallParser::feed(std::string_view text) {
  LOOM_CHECK(!finished_);
  text_.append(text);
  return run(false);
}

StreamDelta ToolCallParser::finish(std::string_view last_text) {
  LOOM_CHECK(!finished_);
  finished_ = true;
  text_.append(last_text);
  return run(true);
}

StreamDelta ToolCallParser::run(bool at_end) {
  StreamDelta delta;
  int num_restates = 0;  // a format restates a bounded number of times in a row
  while (position_ < text_.size()) {
    FormatStep step = format_->step(text_, position_, at_end);
    using Kind = FormatStep::Kind;
    if (step.kind == Kind::kWait) {
      LOOM_CHECK(!at_end);
      break;
    }
    if (step.kind == Kind::kRestate) {
      LOOM_CHECK(++num_restates < 4);
      continue;
    }
    num_restates = 0;
    LOOM_CHECK(step.end > position_ && step.end <= text_.size());
    if (step.kind == Kind::kContent) {
      delta.content.append(text_, position_, step.end - position_);
    } else if (step.kind == Kind::kCalls) {
      for (CallText& call : step.calls) {
        const int32_t index = num_calls_++;
        delta.tool_calls.push_back({index, ids_.next(), std::move(call.name), ""});
        delta.tool_calls.push_back({index, "", "", std::move(call.arguments)});
      }
    }
    position_ = step.end;
  }
  return delta;
}

ParsedOutput parse_tool_calls(ParserKind kind, std::string_view text, uint64_t id_seed) {
  ToolCallParser parser(kind, id_seed);
  // The whole text decided at once (at_end from the first step): the
  // definition that the streamed parse is tested against.
  return assemble_output(parser.finish(text));
}

}  // namespace loom::toolcall
