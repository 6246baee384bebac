// Text and JSON helpers shared by the call formats (internal to the module).
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string_view>

#include "toolcall/call_formats.h"
#include "toolcall/json_extent.h"

namespace loom::toolcall {

inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The first position >= from that is not whitespace (text.size() if none).
size_t skip_spaces(std::string_view text, size_t from);
// The start of the whitespace run that ends at `end` (>= from).
size_t trailing_spaces_start(std::string_view text, size_t from, size_t end);
// text[from...] is a proper prefix of `marker` (the empty rest included).
bool is_proper_prefix_at(std::string_view text, size_t from, std::string_view marker);
// The first position >= from where the rest of the text is a non-empty proper
// prefix of `marker` (a marker that may be completing), text.size() if none.
size_t partial_marker_start(std::string_view text, size_t from, std::string_view marker);

// {"name": "f", "arguments" | "parameters": {...} | "{...}"} -> the call; a
// missing arguments field is {}. nullopt for anything else (bad JSON, no name,
// arguments that are not an object). Never throws.
std::optional<CallText> parse_call_object(std::string_view json_text);
// A JSON object as `arguments` text; nullopt when it is not one.
std::optional<std::string> parse_arguments_object(std::string_view json_text);

// Resumable scan of the JSON value at `begin` (text[begin] is '{' or '['): one
// JsonExtent kept while the same value is being scanned across steps.
class ExtentCache {
 public:
  JsonExtent::Status scan(std::string_view text, size_t begin) {
    if (!extent_ || extent_->begin() != begin) extent_.emplace(begin);
    return extent_->scan(text);
  }
  size_t end() const { return extent_->end(); }
  void reset() { extent_.reset(); }

 private:
  std::optional<JsonExtent> extent_;
};

std::unique_ptr<CallFormat> make_llama3_json_format();

}  // namespace loom::toolcall
