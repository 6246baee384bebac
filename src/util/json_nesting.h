// A guard run on JSON text before any parser or recursive code touches it.
// Deeply nested input ([[[[...) is the one shape that makes recursive JSON code
// (dumping, destroying, error messages) overflow a thread's stack; counting the
// depth of the raw text is linear, allocation-free and cannot recurse.
#pragma once

#include <string_view>

#include "util/error.h"

namespace loom {

// The deepest array/object nesting any bounded input may have: far beyond what
// OpenAI bodies, Hugging Face configs, tokenizer.json or PEFT configs use (< 10).
inline constexpr int kMaxJsonNesting = 64;

// The deepest nesting of arrays and objects in `text`, counting brackets outside
// strings (escapes honoured). Stops scanning once the depth exceeds `stop_after`.
// Works on invalid JSON too (the parser reports those errors afterwards).
int json_nesting_depth(std::string_view text, int stop_after = kMaxJsonNesting);

// Throws Error(kInvalidArgument) naming `what` ("the request body", a file path)
// when `text` nests deeper than `max_depth`.
void check_json_nesting(std::string_view text, std::string_view what, int max_depth = kMaxJsonNesting);
// The same with the error's kind chosen: files we read use ErrorKind::kFormat.
void check_json_nesting(std::string_view text, std::string_view what, ErrorKind kind,
                        int max_depth = kMaxJsonNesting);

}  // namespace loom
