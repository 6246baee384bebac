// Stop-string matching for streamed text, shared by the offline Generator and
// the serving engine.
//
// While streaming, text that might be the start of a stop string is held back
// until it either completes the stop string (then the text is cut before it)
// or can no longer match:
//
//   pending: "... the answer is 42\n\nUs"     stops: {"\n\nUser:"}
//                                ^^^^ held back (proper prefix of a stop string)
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace loom {

// Index of the earliest match of any (non-empty) stop string in `text`, or
// npos; *length (when given) gets the matched stop string's length (the
// longest of those matching there).
size_t find_stop_string(const std::string& text, const std::vector<std::string>& stops, size_t* length = nullptr);

// Length of the longest suffix of `text` that is a proper prefix of a stop
// string: that much must be held back while streaming.
size_t stop_string_hold_back_length(const std::string& text, const std::vector<std::string>& stops);

// Streams text through stop strings. One per sequence; not thread-safe.
class StopStringFilter {
 public:
  // include_stop: the matched stop string ends the text (vLLM's include_stop_str_in_output).
  explicit StopStringFilter(std::vector<std::string> stops, bool include_stop = false)
      : stops_(std::move(stops)), include_stop_(include_stop) {}

  struct Result {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string matched; `text` ends right before it (or with it: include_stop)
  };
  // Appends `text`; with final_flush everything pending is released. With
  // match_stops false (e.g. before min_tokens), nothing is matched or held.
  Result push(const std::string& text, bool final_flush, bool match_stops = true);

 private:
  std::vector<std::string> stops_;
  bool include_stop_ = false;
  std::string pending_;
};

}  // namespace loom
