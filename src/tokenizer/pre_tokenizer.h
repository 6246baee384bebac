// The `pre_tokenizer` section of HF tokenizer.json: splits normalized text into
// words that BPE encodes independently. Supports ByteLevel (GPT-2 regex,
// add_prefix_space), Split (Regex or String pattern, every behavior, invert),
// Digits, Metaspace and Sequence.
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

// One word on its way through the pre-tokenizer steps.
struct PreTokenizedWord {
  std::string text;
  bool starts_input = false;  // begins at offset 0 of the input (Metaspace prepend_scheme "first")
};

class PreTokenizer {
 public:
  // `config` is the JSON value (null means "the whole segment is one word").
  // Throws Error(kUnsupported) naming `context` for a type we do not implement.
  static PreTokenizer from_json(const nlohmann::json& config, const std::string& context);

  // Splits one segment (text between added tokens). Precondition: valid UTF-8.
  std::vector<std::string> split(std::string_view segment, bool segment_starts_input) const;

 private:
  enum class Kind { kByteLevel, kSplit, kDigits, kMetaspace };
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  struct Step {
    Kind kind;
    bool add_prefix_space = false;  // ByteLevel
    std::shared_ptr<const Regex> regex;  // ByteLevel with use_regex; Split with a Regex pattern
    std::string literal;            // Split with a String pattern; Metaspace replacement
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;            // Split
    bool individual_digits = false; // Digits
    std::string prepend_scheme;     // Metaspace: "always" | "first" | "never"
    bool split = true;              // Metaspace
  };
  // One [begin, end) range of a word and whether the pattern matched it.
  struct Range {
    size_t begin, end;
    bool is_match;
  };

  static void append_steps(const nlohmann::json& config, const std::string& context,
                           std::vector<Step>& steps);
  static Behavior parse_behavior(const std::string& name, const std::string& context);
  static void apply_behavior(const PreTokenizedWord& word, std::vector<Range> ranges, Behavior behavior,
                             bool invert, std::vector<PreTokenizedWord>& out);
  static std::vector<Range> ranges_from_matches(const std::vector<std::pair<size_t, size_t>>& matches,
                                                size_t length);
  void apply_step(const Step& step, std::vector<PreTokenizedWord>& words) const;

  std::vector<Step> steps_;
};

}  // namespace loom
