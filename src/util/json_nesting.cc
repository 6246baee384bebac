#include "util/json_nesting.h"

#include "util/error.h"

namespace loom {

int json_nesting_depth(std::string_view text, int stop_after) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
      if (deepest > stop_after) break;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

void check_json_nesting(std::string_view text, std::string_view what, int max_depth) {
  check_json_nesting(text, what, ErrorKind::kInvalidArgument, max_depth);
}

void check_json_nesting(std::string_view text, std::string_view what, ErrorKind kind, int max_depth) {
  if (json_nesting_depth(text, max_depth) > max_depth)
    fail(kind, "{} nests JSON arrays/objects deeper than {} levels", what, max_depth);
}

}  // namespace loom
