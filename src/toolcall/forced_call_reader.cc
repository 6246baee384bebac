#include "toolcall/forced_call_reader.h"

#include <nlohmann/json.hpp>

#include "toolcall/call_format_util.h"
#include "util/error.h"
#include "util/json_nesting.h"

namespace loom::toolcall {
namespace {

// A JSON string token's value ("" when it does not decode).
std::string decode_string(std::string_view token) {
  const nlohmann::json value = nlohmann::json::parse(token, nullptr, /*allow_exceptions=*/false);
  return value.is_string() ? value.get<std::string>() : std::string();
}

}  // namespace

ForcedCallReader::ForcedCallReader(std::string named_function, uint64_t id_seed)
    : named_(std::move(named_function)), ids_(ParserKind::kNone, id_seed) {}

StreamDelta ForcedCallReader::feed(std::string_view text) {
  LOOM_CHECK(!finished_);
  text_.append(text);
  StreamDelta delta;
  scan(delta);
  return delta;
}

StreamDelta ForcedCallReader::finish(std::string_view last_text) {
  LOOM_CHECK(!finished_);
  text_.append(last_text);
  StreamDelta delta;
  scan(delta);
  finished_ = true;
  if (mode_ == Mode::kUndecided) delta.content = text_;  // whitespace only, or nothing
  return delta;
}

void ForcedCallReader::begin_element() {
  ++index_;
  name_.reset();
  key_.clear();
  expect_key_ = true;
  value_pending_ = false;
  args_start_ = args_end_ = std::string::npos;
  call_sent_ = false;
}

void ForcedCallReader::release_call(StreamDelta& delta, size_t scanned_end) {
  if (index_ < 0 || !name_) return;
  if (!call_sent_) {
    delta.tool_calls.push_back({index_, ids_.next(), *name_, ""});
    call_sent_ = true;
  }
  if (args_start_ == std::string::npos) return;
  const size_t end = args_end_ != std::string::npos ? args_end_ : scanned_end;
  if (end <= args_sent_) return;
  delta.tool_calls.push_back({index_, "", "", text_.substr(args_sent_, end - args_sent_)});
  args_sent_ = end;
}

void ForcedCallReader::close_string(size_t end) {
  const bool at_element = named_.empty() && open_.size() == 2;
  if (!at_element) return;
  if (expect_key_) {
    key_ = decode_string(std::string_view(text_).substr(string_start_, end - string_start_));
  } else if (key_ == "name" && !name_) {
    name_ = decode_string(std::string_view(text_).substr(string_start_, end - string_start_));
  } else if (key_ == "parameters" && args_start_ == string_start_) {
    args_end_ = end;
  }
}

void ForcedCallReader::scan(StreamDelta& delta) {
  const bool named = !named_.empty();
  while (position_ < text_.size() && !done_ && mode_ != Mode::kContent) {
    const size_t at = position_++;
    const char c = text_[at];
    if (in_string_) {
      if (escaped_) escaped_ = false;
      else if (c == '\\') escaped_ = true;
      else if (c == '"') {
        in_string_ = false;
        close_string(at + 1);
      }
      continue;
    }
    if (mode_ == Mode::kUndecided) {
      if (is_space(c)) continue;
      if (c != (named ? '{' : '[')) {
        mode_ = Mode::kContent;
        break;
      }
      mode_ = Mode::kCalls;
      if (named) {
        index_ = 0;
        name_ = named_;
        args_start_ = args_sent_ = at;
      }
    }
    const bool at_element = !named && open_.size() == 2;
    if (at_element && value_pending_ && !is_space(c)) {
      value_pending_ = false;
      if (key_ == "parameters") args_start_ = args_sent_ = at;
    }
    switch (c) {
      case '"':
        in_string_ = true;
        string_start_ = at;
        break;
      case '{':
      case '[':
        if (static_cast<int>(open_.size()) >= kMaxJsonNesting) {
          done_ = true;
          break;
        }
        open_.push_back(c);
        if (!named && open_ == "[{") begin_element();
        break;
      case '}':
      case ']': {
        if (open_.empty() || open_.back() != (c == '}' ? '{' : '[')) {
          done_ = true;
          break;
        }
        open_.pop_back();
        if (named) {
          if (open_.empty()) {
            args_end_ = at + 1;
            done_ = true;
          }
          break;
        }
        const bool args_open = key_ == "parameters" && args_start_ != std::string::npos && args_end_ == std::string::npos;
        if (open_.size() == 2 && args_open) args_end_ = at + 1;  // the arguments object closed
        if (open_.size() == 1) {                                 // the element closed
          if (args_open) args_end_ = trailing_spaces_start(text_, args_start_, at);  // a scalar
          release_call(delta, at);
          if (call_sent_ && args_start_ == std::string::npos) delta.tool_calls.push_back({index_, "", "", "{}"});
          name_.reset();
        }
        if (open_.empty()) done_ = true;
        break;
      }
      case ':':
        if (at_element) {
          expect_key_ = false;
          value_pending_ = true;
        }
        break;
      case ',':
        if (at_element) {
          if (key_ == "parameters" && args_start_ != std::string::npos && args_end_ == std::string::npos)
            args_end_ = trailing_spaces_start(text_, args_start_, at);  // a scalar
          expect_key_ = true;
        }
        break;
      default:
        break;
    }
  }
  if (mode_ == Mode::kContent) {
    delta.content.append(text_, content_sent_, std::string::npos);
    content_sent_ = text_.size();
    position_ = text_.size();
    return;
  }
  release_call(delta, position_);
}

ParsedOutput read_forced_output(const std::string& named_function, std::string_view text, uint64_t id_seed) {
  ForcedCallReader reader(named_function, id_seed);
  return assemble_output(reader.finish(text));
}

}  // namespace loom::toolcall
