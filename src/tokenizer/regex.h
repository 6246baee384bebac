// A compiled PCRE2 pattern in UTF + UCP mode (JIT-compiled when available),
// used for the pre-tokenizer split patterns of HF tokenizer.json.
//
// Thread safety: immutable after construction; find_all may run concurrently
// (each call owns its match data).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct pcre2_real_code_8;

namespace loom {

class Regex {
 public:
  // Throws Error(kUnsupported) naming `context` when PCRE2 rejects the pattern.
  Regex(const std::string& pattern, const std::string& context);

  // Non-overlapping matches, left to right, as [begin, end) byte offsets.
  // Precondition: `text` is valid UTF-8. Empty matches are skipped.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  std::shared_ptr<pcre2_real_code_8> code_;
};

}  // namespace loom
