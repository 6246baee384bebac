#include "tokenizer/decoder.h"

#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace loom {
namespace {

std::optional<uint8_t> byte_fallback_value(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return std::nullopt;
  unsigned value = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = token[i];
    value <<= 4;
    if (c >= '0' && c <= '9') value |= static_cast<unsigned>(c - '0');
    else if (c >= 'A' && c <= 'F') value |= static_cast<unsigned>(c - 'A' + 10);
    else if (c >= 'a' && c <= 'f') value |= static_cast<unsigned>(c - 'a' + 10);
    else return std::nullopt;
  }
  return static_cast<uint8_t>(value);
}

std::string replace_all(const std::string& text, const std::string& pattern, const std::string& content) {
  if (pattern.empty()) return text;
  std::string out;
  size_t pos = 0, found;
  while ((found = text.find(pattern, pos)) != std::string::npos) {
    out.append(text, pos, found - pos);
    out += content;
    pos = found + pattern.size();
  }
  out.append(text, pos, std::string::npos);
  return out;
}

std::vector<std::string> split_chars(const std::string& text) {
  std::vector<std::string> chars;
  size_t pos = 0;
  while (pos < text.size()) {
    uint32_t code_point = 0;
    const size_t length = utf8::decode_code_point(text, pos, code_point);
    chars.push_back(text.substr(pos, length));
    pos += length;
  }
  return chars;
}

}  // namespace

Decoder Decoder::from_json(const nlohmann::json& config, const std::string& context) {
  Decoder decoder;
  if (!config.is_null()) append_steps(config, context, decoder.steps_);
  return decoder;
}

void Decoder::append_steps(const nlohmann::json& config, const std::string& context, std::vector<Step>& steps) {
  const std::string type = config.value("type", "");
  Step step{};
  if (type == "Sequence") {
    for (const auto& child : config.at("decoders")) append_steps(child, context, steps);
    return;
  } else if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
  } else if (type == "ByteFallback") {
    step.kind = Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = Kind::kFuse;
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    step.pattern = config.value("replacement", std::string("\xE2\x96\x81"));
    if (config.contains("prepend_scheme")) {
      step.metaspace_drops_first = config.at("prepend_scheme").get<std::string>() != "never";
    } else {
      step.metaspace_drops_first = config.value("add_prefix_space", true);
    }
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    const auto& pattern = config.at("pattern");
    if (!pattern.contains("String")) fail(ErrorKind::kUnsupported, "{}: Replace decoder with a Regex pattern", context);
    step.pattern = pattern.at("String").get<std::string>();
    step.content = config.at("content").get<std::string>();
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    step.pattern = config.at("content").get<std::string>();
    step.strip_start = config.value("start", 0);
    step.strip_stop = config.value("stop", 0);
  } else {
    fail(ErrorKind::kUnsupported, "{}: decoder type '{}' is not supported", context, type);
  }
  steps.push_back(std::move(step));
}

void Decoder::apply(const Step& step, std::vector<std::string>& tokens) {
  switch (step.kind) {
    case Kind::kByteLevel: {
      const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
      std::string bytes;
      for (const std::string& token : tokens) {
        const auto decoded = alphabet.decode(token);
        bytes += decoded ? *decoded : token;
      }
      tokens.assign(1, utf8::to_valid_lossy(bytes));
      break;
    }
    case Kind::kByteFallback: {
      std::vector<std::string> out;
      std::string pending;
      const auto flush = [&] {
        if (pending.empty()) return;
        if (utf8::is_valid(pending)) {
          out.push_back(pending);
        } else {
          for (size_t i = 0; i < pending.size(); ++i) out.push_back("\xEF\xBF\xBD");
        }
        pending.clear();
      };
      for (std::string& token : tokens) {
        if (const auto byte = byte_fallback_value(token)) {
          pending.push_back(static_cast<char>(*byte));
        } else {
          flush();
          out.push_back(std::move(token));
        }
      }
      flush();
      tokens = std::move(out);
      break;
    }
    case Kind::kFuse: {
      std::string joined;
      for (const std::string& token : tokens) joined += token;
      tokens.assign(1, std::move(joined));
      break;
    }
    case Kind::kMetaspace:
      for (size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = replace_all(tokens[i], step.pattern, i == 0 && step.metaspace_drops_first ? "" : " ");
      }
      break;
    case Kind::kReplace:
      for (std::string& token : tokens) token = replace_all(token, step.pattern, step.content);
      break;
    case Kind::kStrip:
      for (std::string& token : tokens) {
        const std::vector<std::string> chars = split_chars(token);
        size_t start_cut = 0;
        for (size_t i = 0; i < std::min(step.strip_start, chars.size()) && chars[i] == step.pattern; ++i) start_cut = i + 1;
        size_t stop_cut = chars.size();
        for (size_t i = 0; i < step.strip_stop && i < chars.size(); ++i) {
          const size_t index = chars.size() - i - 1;
          if (chars[index] != step.pattern) break;
          stop_cut = index;
        }
        std::string stripped;
        for (size_t i = start_cut; i < stop_cut; ++i) stripped += chars[i];
        token = std::move(stripped);
      }
      break;
  }
}

std::string Decoder::decode(std::vector<std::string> tokens) const {
  for (const Step& step : steps_) apply(step, tokens);
  std::string text;
  for (const std::string& token : tokens) text += token;
  return text;
}

std::string Decoder::token_bytes(const std::string& token) const {
  std::string text = token;
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::kByteLevel:
        if (const auto decoded = ByteLevelAlphabet::get().decode(text)) text = *decoded;
        break;
      case Kind::kByteFallback:
        if (const auto byte = byte_fallback_value(text)) text = std::string(1, static_cast<char>(*byte));
        break;
      case Kind::kMetaspace:
        text = replace_all(text, step.pattern, " ");
        break;
      case Kind::kReplace:
        text = replace_all(text, step.pattern, step.content);
        break;
      case Kind::kStrip:
      case Kind::kFuse:
        break;  // position-dependent; a lone token keeps its text
    }
  }
  return text;
}

}  // namespace loom
