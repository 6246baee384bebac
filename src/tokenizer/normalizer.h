// The `normalizer` section of HF tokenizer.json: NFC/NFD/NFKC/NFKD, Lowercase,
// Prepend, Replace and Sequence of those.
//
// Thread safety: immutable after construction.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom {

class Regex;

class Normalizer {
 public:
  // `config` is the JSON value (null means no normalization). Throws
  // Error(kUnsupported) naming `context` for a type we do not implement.
  static Normalizer from_json(const nlohmann::json& config, const std::string& context);

  // Precondition: `text` is valid UTF-8.
  std::string apply(std::string_view text) const;
  bool empty() const { return steps_.empty(); }

 private:
  enum class Kind { kNFC, kNFD, kNFKC, kNFKD, kLowercase, kPrepend, kReplace };
  struct Step {
    Kind kind;
    std::string text;         // Prepend: the prefix; Replace: the literal pattern
    std::string replacement;  // Replace
    std::shared_ptr<const Regex> regex;  // Replace with a Regex pattern
  };
  static void append_steps(const nlohmann::json& config, const std::string& context,
                           std::vector<Step>& steps);
  std::vector<Step> steps_;
};

}  // namespace loom
