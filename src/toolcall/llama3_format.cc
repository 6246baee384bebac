// Llama-3.1+ JSON tool calls: the output starts with the calls or is plain
// content. Calls are JSON objects {"name", "parameters"} separated by ';', each
// optionally after <|python_tag|>; once anything else appears, the rest of the
// output is content (calls already read stay calls). <|eom_id|>/<|eot_id|>
// after a call are dropped (they reach the text when special tokens are kept).
#include <string_view>

#include "toolcall/call_format_util.h"

namespace loom::toolcall {
namespace {

using Kind = FormatStep::Kind;

constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kEndMarkers[] = {"<|eom_id|>", "<|eot_id|>"};

class Llama3JsonFormat final : public CallFormat {
 public:
  FormatStep step(std::string_view text, size_t position, bool at_end) override {
    switch (mode_) {
      case Mode::kContentOnly:
        return FormatStep::content(text.size());
      case Mode::kStart: {
        // Leading whitespace belongs to the content if no call follows: decide first.
        const size_t start = skip_spaces(text, position);
        if (start == text.size()) return at_end ? content_from_here() : FormatStep::wait();
        return call_or_content(text, position, start, at_end);
      }
      case Mode::kAfterCall: {
        if (const size_t end = skip_spaces(text, position); end > position) return FormatStep::skip(end);
        for (const std::string_view marker : kEndMarkers)
          if (text.substr(position, marker.size()) == marker) return FormatStep::skip(position + marker.size());
        if (text[position] == ';') {
          mode_ = Mode::kExpectCall;
          return FormatStep::skip(position + 1);
        }
        if (!at_end)
          for (const std::string_view marker : kEndMarkers)
            if (is_proper_prefix_at(text, position, marker)) return FormatStep::wait();
        return content_from_here();
      }
      case Mode::kExpectCall: {
        if (const size_t end = skip_spaces(text, position); end > position) return FormatStep::skip(end);
        return call_or_content(text, position, position, at_end);
      }
    }
    return content_from_here();
  }

 private:
  enum class Mode { kStart, kAfterCall, kExpectCall, kContentOnly };

  FormatStep content_from_here() {
    mode_ = Mode::kContentOnly;
    extent_.reset();
    return FormatStep::restate();
  }

  // A call at `start` (text[position, start) is whitespace) or the end of the calls.
  FormatStep call_or_content(std::string_view text, size_t position, size_t start, bool at_end) {
    size_t object = start;
    if (text.substr(start, kPythonTag.size()) == kPythonTag) {
      object = skip_spaces(text, start + kPythonTag.size());
      if (object == text.size()) return at_end ? content_from_here() : FormatStep::wait();
    } else if (is_proper_prefix_at(text, start, kPythonTag)) {
      return at_end ? content_from_here() : FormatStep::wait();
    }
    if (text[object] != '{') return content_from_here();
    switch (extent_.scan(text, object)) {
      case JsonExtent::Status::kIncomplete:
        return at_end ? content_from_here() : FormatStep::wait();
      case JsonExtent::Status::kInvalid:
        return content_from_here();
      case JsonExtent::Status::kComplete:
        break;
    }
    const size_t end = extent_.end();
    std::optional<CallText> call = parse_call_object(text.substr(object, end - object));
    if (!call) return content_from_here();
    extent_.reset();
    mode_ = Mode::kAfterCall;
    return FormatStep::found_calls(end, {std::move(*call)});
  }

  Mode mode_ = Mode::kStart;
  ExtentCache extent_;
};

}  // namespace

std::unique_ptr<CallFormat> make_llama3_json_format() { return std::make_unique<Llama3JsonFormat>(); }

}  // namespace loom::toolcall
