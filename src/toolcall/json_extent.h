// Where a JSON object or array that starts at a known offset ends, found one
// piece of text at a time (a streamed output grows by a token at a time; the
// scan resumes where it stopped, so a long call costs linear time).
//
// Structural only: brackets, strings and escapes. The value's syntax is the
// JSON parser's to check once the extent is known. What a prefix already
// shows to be wrong (a closer that does not match, nesting deeper than
// kMaxJsonNesting) is kInvalid at once, and stays so whatever follows.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace loom::toolcall {

class JsonExtent {
 public:
  enum class Status { kIncomplete, kComplete, kInvalid };

  // Precondition: the text scanned later has '{' or '[' at `begin`.
  explicit JsonExtent(size_t begin) : begin_(begin), position_(begin) {}

  // Continues over `text`, the whole buffer so far: each call must pass the
  // previous text or an extension of it. Once kComplete or kInvalid, returns
  // that again without scanning.
  Status scan(std::string_view text);

  size_t begin() const { return begin_; }
  // One past the closing bracket; valid when scan() returned kComplete.
  size_t end() const { return position_; }

 private:
  size_t begin_;
  size_t position_;  // next byte to scan
  std::string open_brackets_;  // '{' / '[' still open, innermost last
  bool in_string_ = false;
  bool escaped_ = false;
  Status status_ = Status::kIncomplete;
};

}  // namespace loom::toolcall
