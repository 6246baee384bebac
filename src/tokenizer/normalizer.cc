#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace loom {
namespace {

std::string replace_literal(std::string_view text, const std::string& pattern, const std::string& replacement) {
  if (pattern.empty()) return std::string(text);
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t found = text.find(pattern, pos);
    if (found == std::string_view::npos) break;
    out.append(text.substr(pos, found - pos));
    out.append(replacement);
    pos = found + pattern.size();
  }
  out.append(text.substr(pos));
  return out;
}

std::string lowercase(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    uint32_t code_point = 0;
    pos += utf8::decode_code_point(text, pos, code_point);
    utf8::append_code_point(out, static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(code_point))));
  }
  return out;
}

}  // namespace

Normalizer Normalizer::from_json(const nlohmann::json& config, const std::string& context) {
  Normalizer normalizer;
  if (!config.is_null()) append_steps(config, context, normalizer.steps_);
  return normalizer;
}

void Normalizer::append_steps(const nlohmann::json& config, const std::string& context,
                              std::vector<Step>& steps) {
  const std::string type = config.value("type", "");
  if (type == "Sequence") {
    for (const auto& child : config.at("normalizers")) append_steps(child, context, steps);
  } else if (type == "NFC") {
    steps.push_back({Kind::kNFC, {}, {}, nullptr});
  } else if (type == "NFD") {
    steps.push_back({Kind::kNFD, {}, {}, nullptr});
  } else if (type == "NFKC") {
    steps.push_back({Kind::kNFKC, {}, {}, nullptr});
  } else if (type == "NFKD") {
    steps.push_back({Kind::kNFKD, {}, {}, nullptr});
  } else if (type == "Lowercase") {
    steps.push_back({Kind::kLowercase, {}, {}, nullptr});
  } else if (type == "Prepend") {
    steps.push_back({Kind::kPrepend, config.at("prepend").get<std::string>(), {}, nullptr});
  } else if (type == "Replace") {
    const auto& pattern = config.at("pattern");
    Step step{Kind::kReplace, {}, config.at("content").get<std::string>(), nullptr};
    if (pattern.contains("Regex")) {
      step.regex = std::make_shared<Regex>(pattern.at("Regex").get<std::string>(), context);
    } else {
      step.text = pattern.at("String").get<std::string>();
    }
    steps.push_back(std::move(step));
  } else {
    fail(ErrorKind::kUnsupported, "{}: normalizer type '{}' is not supported", context, type);
  }
}

std::string Normalizer::apply(std::string_view input) const {
  std::string text(input);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::kNFC: text = utf8::normalize(text, utf8::NormalizationForm::kNFC); break;
      case Kind::kNFD: text = utf8::normalize(text, utf8::NormalizationForm::kNFD); break;
      case Kind::kNFKC: text = utf8::normalize(text, utf8::NormalizationForm::kNFKC); break;
      case Kind::kNFKD: text = utf8::normalize(text, utf8::NormalizationForm::kNFKD); break;
      case Kind::kLowercase: text = lowercase(text); break;
      case Kind::kPrepend:
        if (!text.empty()) text = step.text + text;
        break;
      case Kind::kReplace:
        if (step.regex) {
          std::string out;
          size_t pos = 0;
          for (const auto& [begin, end] : step.regex->find_all(text)) {
            out.append(text, pos, begin - pos);
            out.append(step.replacement);
            pos = end;
          }
          out.append(text, pos, std::string::npos);
          text = std::move(out);
        } else {
          text = replace_literal(text, step.text, step.replacement);
        }
        break;
    }
  }
  return text;
}

}  // namespace loom
