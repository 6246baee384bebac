#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "util/error.h"

namespace loom {

Regex::Regex(const std::string& pattern, const std::string& context) : pattern_(pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    fail(ErrorKind::kUnsupported, "{}: regex {} does not compile at offset {}: {}", context, pattern,
         error_offset, reinterpret_cast<const char*>(message));
  }
  // JIT is an optimisation only; the interpreter gives the same matches.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  code_.reset(code, pcre2_code_free);
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match_data(
      pcre2_match_data_create_from_pattern(code_.get(), nullptr), &pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  uint32_t options = 0;  // the first call validates UTF-8, later ones skip it
  while (offset <= text.size()) {
    const int rc = pcre2_match(code_.get(), subject, text.size(), offset, options, match_data.get(), nullptr);
    options = PCRE2_NO_UTF_CHECK;
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      fail(ErrorKind::kInvalidArgument, "regex {} failed on input: {}", pattern_,
           reinterpret_cast<const char*>(message));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data.get());
    const size_t begin = ovector[0], end = ovector[1];
    if (end > begin) {
      matches.emplace_back(begin, end);
      offset = end;
    } else {
      // Empty match: step over one whole character.
      offset = end + 1;
      while (offset < text.size() && (static_cast<uint8_t>(text[offset]) & 0xC0) == 0x80) ++offset;
    }
  }
  return matches;
}

}  // namespace loom
