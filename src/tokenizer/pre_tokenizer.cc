#include "tokenizer/pre_tokenizer.h"

#include <algorithm>

#include "tokenizer/byte_level.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace loom {
namespace {

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::vector<std::pair<size_t, size_t>> find_literal(std::string_view text, const std::string& literal) {
  std::vector<std::pair<size_t, size_t>> matches;
  if (literal.empty()) return matches;
  size_t pos = 0;
  while ((pos = text.find(literal, pos)) != std::string_view::npos) {
    matches.emplace_back(pos, pos + literal.size());
    pos += literal.size();
  }
  return matches;
}

}  // namespace

PreTokenizer PreTokenizer::from_json(const nlohmann::json& config, const std::string& context) {
  PreTokenizer pre_tokenizer;
  if (!config.is_null()) append_steps(config, context, pre_tokenizer.steps_);
  return pre_tokenizer;
}

PreTokenizer::Behavior PreTokenizer::parse_behavior(const std::string& name, const std::string& context) {
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  fail(ErrorKind::kUnsupported, "{}: split behavior '{}' is not supported", context, name);
}

void PreTokenizer::append_steps(const nlohmann::json& config, const std::string& context,
                                std::vector<Step>& steps) {
  const std::string type = config.value("type", "");
  Step step{};
  if (type == "Sequence") {
    for (const auto& child : config.at("pretokenizers")) append_steps(child, context, steps);
    return;
  } else if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
    step.add_prefix_space = config.value("add_prefix_space", true);
    if (config.value("use_regex", true)) step.regex = std::make_shared<Regex>(kGpt2Pattern, context);
  } else if (type == "Split") {
    step.kind = Kind::kSplit;
    const auto& pattern = config.at("pattern");
    if (pattern.contains("Regex")) {
      step.regex = std::make_shared<Regex>(pattern.at("Regex").get<std::string>(), context);
    } else {
      step.literal = pattern.at("String").get<std::string>();
    }
    step.behavior = parse_behavior(config.at("behavior").get<std::string>(), context);
    step.invert = config.value("invert", false);
  } else if (type == "Digits") {
    step.kind = Kind::kDigits;
    step.individual_digits = config.value("individual_digits", false);
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    step.literal = config.value("replacement", std::string("\xE2\x96\x81"));
    if (config.contains("prepend_scheme")) {
      step.prepend_scheme = config.at("prepend_scheme").get<std::string>();
    } else {
      step.prepend_scheme = config.value("add_prefix_space", true) ? "always" : "never";
    }
    step.split = config.value("split", true);
  } else {
    fail(ErrorKind::kUnsupported, "{}: pre_tokenizer type '{}' is not supported", context, type);
  }
  steps.push_back(std::move(step));
}

std::vector<PreTokenizer::Range> PreTokenizer::ranges_from_matches(
    const std::vector<std::pair<size_t, size_t>>& matches, size_t length) {
  std::vector<Range> ranges;
  size_t previous_end = 0;
  for (const auto& [begin, end] : matches) {
    if (begin > previous_end) ranges.push_back({previous_end, begin, false});
    ranges.push_back({begin, end, true});
    previous_end = end;
  }
  if (previous_end < length) ranges.push_back({previous_end, length, false});
  return ranges;
}

// Mirrors tokenizers' NormalizedString::split, including its quirks (e.g.
// MergedWithPrevious does not merge a match into a preceding match).
void PreTokenizer::apply_behavior(const PreTokenizedWord& word, std::vector<Range> ranges, Behavior behavior,
                                  bool invert, std::vector<PreTokenizedWord>& out) {
  if (invert) {
    for (Range& range : ranges) range.is_match = !range.is_match;
  }
  std::vector<Range> kept;
  switch (behavior) {
    case Behavior::kIsolated:
      kept = ranges;
      break;
    case Behavior::kRemoved:
      for (const Range& range : ranges)
        if (!range.is_match) kept.push_back(range);
      break;
    case Behavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const Range& range : ranges) {
        if (range.is_match && !previous_match && !kept.empty()) {
          kept.back().end = range.end;
        } else {
          kept.push_back(range);
        }
        previous_match = range.is_match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = ranges.rbegin(); it != ranges.rend(); ++it) {
        if (it->is_match && !previous_match && !kept.empty()) {
          kept.back().begin = it->begin;
        } else {
          kept.push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
    case Behavior::kContiguous: {
      bool previous_match = false;
      for (const Range& range : ranges) {
        if (range.is_match == previous_match && !kept.empty()) {
          kept.back().end = range.end;
        } else {
          kept.push_back(range);
        }
        previous_match = range.is_match;
      }
      break;
    }
  }
  for (const Range& range : kept) {
    if (range.end <= range.begin) continue;
    out.push_back({word.text.substr(range.begin, range.end - range.begin), word.starts_input && range.begin == 0});
  }
}

void PreTokenizer::apply_step(const Step& step, std::vector<PreTokenizedWord>& words) const {
  std::vector<PreTokenizedWord> out;
  out.reserve(words.size());
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
  for (PreTokenizedWord& word : words) {
    switch (step.kind) {
      case Kind::kByteLevel: {
        if (step.add_prefix_space && (word.text.empty() || word.text[0] != ' ')) word.text = " " + word.text;
        std::vector<PreTokenizedWord> pieces;
        if (step.regex) {
          apply_behavior(word, ranges_from_matches(step.regex->find_all(word.text), word.text.size()),
                         Behavior::kIsolated, false, pieces);
        } else if (!word.text.empty()) {
          pieces.push_back(std::move(word));
        }
        for (PreTokenizedWord& piece : pieces) out.push_back({alphabet.encode(piece.text), piece.starts_input});
        break;
      }
      case Kind::kSplit: {
        const auto matches = step.regex ? step.regex->find_all(word.text) : find_literal(word.text, step.literal);
        apply_behavior(word, ranges_from_matches(matches, word.text.size()), step.behavior, step.invert, out);
        break;
      }
      case Kind::kDigits: {
        std::vector<std::pair<size_t, size_t>> matches;
        size_t pos = 0;
        while (pos < word.text.size()) {
          uint32_t code_point = 0;
          const size_t length = utf8::decode_code_point(word.text, pos, code_point);
          if (utf8::is_numeric(code_point)) matches.emplace_back(pos, pos + length);
          pos += length;
        }
        apply_behavior(word, ranges_from_matches(matches, word.text.size()),
                       step.individual_digits ? Behavior::kIsolated : Behavior::kContiguous, false, out);
        break;
      }
      case Kind::kMetaspace: {
        std::string text;
        for (char c : word.text) {
          if (c == ' ') {
            text += step.literal;
          } else {
            text.push_back(c);
          }
        }
        const bool starts_with_replacement = text.rfind(step.literal, 0) == 0;
        if (!starts_with_replacement &&
            (step.prepend_scheme == "always" || (step.prepend_scheme == "first" && word.starts_input))) {
          text.insert(0, step.literal);
        }
        PreTokenizedWord replaced{std::move(text), word.starts_input};
        if (step.split) {
          apply_behavior(replaced, ranges_from_matches(find_literal(replaced.text, step.literal), replaced.text.size()),
                         Behavior::kMergedWithNext, false, out);
        } else if (!replaced.text.empty()) {
          out.push_back(std::move(replaced));
        }
        break;
      }
    }
  }
  words = std::move(out);
}

std::vector<std::string> PreTokenizer::split(std::string_view segment, bool segment_starts_input) const {
  std::vector<PreTokenizedWord> words;
  words.push_back({std::string(segment), segment_starts_input});
  for (const Step& step : steps_) apply_step(step, words);
  std::vector<std::string> texts;
  texts.reserve(words.size());
  for (PreTokenizedWord& word : words)
    if (!word.text.empty()) texts.push_back(std::move(word.text));
  return texts;
}

}  // namespace loom
