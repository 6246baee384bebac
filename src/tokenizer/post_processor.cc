#include "tokenizer/post_processor.h"

#include "util/error.h"

namespace loom {

PostProcessor PostProcessor::from_json(const nlohmann::json& config, const std::string& context) {
  PostProcessor processor;
  if (!config.is_null()) append(config, context, processor);
  return processor;
}

void PostProcessor::append(const nlohmann::json& config, const std::string& context, PostProcessor& processor) {
  const std::string type = config.value("type", "");
  if (type == "Sequence") {
    for (const auto& child : config.at("processors")) append(child, context, processor);
  } else if (type == "ByteLevel") {
    // Only adjusts offsets; ids are unchanged.
  } else if (type == "TemplateProcessing") {
    // Each processor of a Sequence wraps the output of the previous one.
    std::vector<TokenId> prefix, suffix;
    bool seen_sequence = false;
    for (const auto& piece : config.at("single")) {
      if (piece.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
      const auto& special_tokens = config.at("special_tokens");
      if (!special_tokens.contains(name)) {
        fail(ErrorKind::kFormat, "{}: post_processor template names undefined special token '{}'", context, name);
      }
      for (const auto& id : special_tokens.at(name).at("ids")) (seen_sequence ? suffix : prefix).push_back(id.get<TokenId>());
    }
    processor.prefix_ids_.insert(processor.prefix_ids_.begin(), prefix.begin(), prefix.end());
    processor.suffix_ids_.insert(processor.suffix_ids_.end(), suffix.begin(), suffix.end());
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    processor.prefix_ids_.insert(processor.prefix_ids_.begin(), config.at("cls").at(1).get<TokenId>());
    processor.suffix_ids_.push_back(config.at("sep").at(1).get<TokenId>());
  } else {
    fail(ErrorKind::kUnsupported, "{}: post_processor type '{}' is not supported", context, type);
  }
}

void PostProcessor::apply(std::vector<TokenId>& ids) const {
  ids.insert(ids.begin(), prefix_ids_.begin(), prefix_ids_.end());
  ids.insert(ids.end(), suffix_ids_.begin(), suffix_ids_.end());
}

}  // namespace loom
