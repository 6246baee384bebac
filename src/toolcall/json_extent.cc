#include "toolcall/json_extent.h"

#include "util/json_nesting.h"

namespace loom::toolcall {

JsonExtent::Status JsonExtent::scan(std::string_view text) {
  while (status_ == Status::kIncomplete && position_ < text.size()) {
    const char c = text[position_++];
    if (in_string_) {
      if (escaped_) escaped_ = false;
      else if (c == '\\') escaped_ = true;
      else if (c == '"') in_string_ = false;
      continue;
    }
    switch (c) {
      case '"':
        in_string_ = true;
        break;
      case '{':
      case '[':
        open_brackets_.push_back(c);
        if (static_cast<int>(open_brackets_.size()) > kMaxJsonNesting) status_ = Status::kInvalid;
        break;
      case '}':
      case ']':
        if (open_brackets_.empty() || open_brackets_.back() != (c == '}' ? '{' : '[')) {
          status_ = Status::kInvalid;
          break;
        }
        open_brackets_.pop_back();
        if (open_brackets_.empty()) status_ = Status::kComplete;
        break;
      default:
        break;
    }
  }
  return status_;
}

}  // namespace loom::toolcall
