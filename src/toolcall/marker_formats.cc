// Hermes/Qwen <tool_call> and Mistral [TOOL_CALLS]: content with call regions
// that begin at a marker. Both scan content for the marker the same way;
// they differ in what a region holds after it.
#include <string_view>

#include <nlohmann/json.hpp>

#include "toolcall/call_format_util.h"

namespace loom::toolcall {
namespace {

using Kind = FormatStep::Kind;

// What follows a marker: a region is complete (its end and calls), malformed
// (the marker is then content) or needs more text.
struct Region {
  enum class Status { kComplete, kMalformed, kWait };
  Status status = Status::kMalformed;
  size_t end = 0;
  std::vector<CallText> calls;

  static Region make(Status status, size_t end = 0, std::vector<CallText> calls = {}) {
    Region region;
    region.status = status;
    region.end = end;
    region.calls = std::move(calls);
    return region;
  }
  static Region malformed() { return make(Status::kMalformed); }
  static Region wait() { return make(Status::kWait); }
  static Region wait_or_malformed(bool at_end) { return make(at_end ? Status::kMalformed : Status::kWait); }
};

class MarkerFormat : public CallFormat {
 public:
  explicit MarkerFormat(std::string_view marker) : marker_(marker) {}

  FormatStep step(std::string_view text, size_t position, bool at_end) final {
    if (after_call_) {
      const size_t end = skip_spaces(text, position);
      if (end > position) return FormatStep::skip(end);
      after_call_ = false;
      return FormatStep::restate();
    }
    const size_t marker = text.find(marker_, position);
    if (marker == std::string_view::npos) {
      if (at_end) return FormatStep::content(text.size());
      // Hold back what may still become a marker, and the whitespace before it.
      const size_t held = trailing_spaces_start(text, position, partial_marker_start(text, position, marker_));
      return held > position ? FormatStep::content(held) : FormatStep::wait();
    }
    const size_t spaces = trailing_spaces_start(text, position, marker);
    if (spaces > position) return FormatStep::content(spaces);
    Region region = parse_region(text, marker + marker_.size(), at_end);
    switch (region.status) {
      case Region::Status::kWait:
        return FormatStep::wait();
      case Region::Status::kMalformed:
        extent_.reset();
        return FormatStep::content(marker + marker_.size());
      case Region::Status::kComplete:
        extent_.reset();
        after_call_ = true;
        return FormatStep::found_calls(region.end, std::move(region.calls));
    }
    return FormatStep::wait();
  }

 protected:
  // The region after the marker, which ends at `begin`.
  virtual Region parse_region(std::string_view text, size_t begin, bool at_end) = 0;

  // The JSON value at text[begin] ('{' or '['): its end, or the region's fate.
  Region scan_json(std::string_view text, size_t begin, bool at_end) {
    switch (extent_.scan(text, begin)) {
      case JsonExtent::Status::kIncomplete: return Region::wait_or_malformed(at_end);
      case JsonExtent::Status::kInvalid: return Region::malformed();
      case JsonExtent::Status::kComplete: return Region::make(Region::Status::kComplete, extent_.end());
    }
    return Region::malformed();
  }

 private:
  std::string_view marker_;
  bool after_call_ = false;
  ExtentCache extent_;
};

// <tool_call> {"name": ..., "arguments": {...}} </tool_call>. A missing closing
// tag is forgiven at the very end of the output (a stop string may have cut it).
class HermesFormat final : public MarkerFormat {
 public:
  HermesFormat() : MarkerFormat(kOpen) {}

 private:
  static constexpr std::string_view kOpen = "<tool_call>";
  static constexpr std::string_view kClose = "</tool_call>";

  Region parse_region(std::string_view text, size_t begin, bool at_end) override {
    const size_t object = skip_spaces(text, begin);
    if (object == text.size()) return Region::wait_or_malformed(at_end);
    if (text[object] != '{') return Region::malformed();
    Region region = scan_json(text, object, at_end);
    if (region.status != Region::Status::kComplete) return region;
    std::optional<CallText> call = parse_call_object(text.substr(object, region.end - object));
    if (!call) return Region::malformed();
    const size_t close = skip_spaces(text, region.end);
    if (text.substr(close, kClose.size()) == kClose) return Region::make(Region::Status::kComplete, close + kClose.size(), {*call});
    if (!is_proper_prefix_at(text, close, kClose)) return Region::malformed();
    if (!at_end) return Region::wait();
    if (close < text.size()) return Region::malformed();
    return Region::make(Region::Status::kComplete, text.size(), {*call});
  }
};

// [TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]   (v3)
// [TOOL_CALLS]name[ARGS]{...}                           (v11+, one call per marker)
class MistralFormat final : public MarkerFormat {
 public:
  MistralFormat() : MarkerFormat("[TOOL_CALLS]") {}

 private:
  static constexpr std::string_view kArgs = "[ARGS]";

  static bool is_name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.';
  }

  Region parse_region(std::string_view text, size_t begin, bool at_end) override {
    const size_t start = skip_spaces(text, begin);
    if (start == text.size()) return Region::wait_or_malformed(at_end);
    return text[start] == '[' ? parse_list(text, start, at_end) : parse_named(text, start, at_end);
  }

  Region parse_list(std::string_view text, size_t list, bool at_end) {
    Region region = scan_json(text, list, at_end);
    if (region.status != Region::Status::kComplete) return region;
    // One parse for the list, then each element as a call object.
    const nlohmann::ordered_json value = nlohmann::ordered_json::parse(text.substr(list, region.end - list), nullptr, false);
    if (!value.is_array() || value.empty()) return Region::malformed();
    for (const auto& element : value) {
      std::optional<CallText> call =
          parse_call_object(element.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
      if (!call) return Region::malformed();
      region.calls.push_back(std::move(*call));
    }
    return region;
  }

  Region parse_named(std::string_view text, size_t name, bool at_end) {
    size_t name_end = name;
    while (name_end < text.size() && is_name_char(text[name_end])) ++name_end;
    if (name_end == name) return Region::malformed();
    if (name_end == text.size()) return Region::wait_or_malformed(at_end);
    if (text.substr(name_end, kArgs.size()) != kArgs)
      return is_proper_prefix_at(text, name_end, kArgs) ? Region::wait_or_malformed(at_end)
                                                         : Region::malformed();
    const size_t object = skip_spaces(text, name_end + kArgs.size());
    if (object == text.size()) return Region::wait_or_malformed(at_end);
    if (text[object] != '{') return Region::malformed();
    Region region = scan_json(text, object, at_end);
    if (region.status != Region::Status::kComplete) return region;
    std::optional<std::string> arguments = parse_arguments_object(text.substr(object, region.end - object));
    if (!arguments) return Region::malformed();
    region.calls.push_back({std::string(text.substr(name, name_end - name)), std::move(*arguments)});
    return region;
  }
};

class NoCallsFormat final : public CallFormat {
 public:
  FormatStep step(std::string_view text, size_t, bool) override { return FormatStep::content(text.size()); }
};

}  // namespace

std::unique_ptr<CallFormat> make_call_format(ParserKind kind) {
  switch (kind) {
    case ParserKind::kHermes: return std::make_unique<HermesFormat>();
    case ParserKind::kMistral: return std::make_unique<MistralFormat>();
    case ParserKind::kLlama3Json: return make_llama3_json_format();
    case ParserKind::kNone: break;
  }
  return std::make_unique<NoCallsFormat>();
}

}  // namespace loom::toolcall
