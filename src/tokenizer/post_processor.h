// The `post_processor` section of HF tokenizer.json, reduced to what a single
// sequence needs: the special-token ids placed before and after it when
// add_special_tokens is set (TemplateProcessing, Roberta/Bert, ByteLevel as a
// no-op, Sequence of those).
//
// Thread safety: immutable after construction.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom {

using TokenId = int32_t;

class PostProcessor {
 public:
  // Throws Error(kUnsupported) naming `context` for an unknown type, and
  // Error(kFormat) for a template naming an undefined special token.
  static PostProcessor from_json(const nlohmann::json& config, const std::string& context);

  void apply(std::vector<TokenId>& ids) const;
  const std::vector<TokenId>& prefix_ids() const { return prefix_ids_; }
  const std::vector<TokenId>& suffix_ids() const { return suffix_ids_; }

 private:
  static void append(const nlohmann::json& config, const std::string& context, PostProcessor& processor);
  std::vector<TokenId> prefix_ids_;
  std::vector<TokenId> suffix_ids_;
};

}  // namespace loom
