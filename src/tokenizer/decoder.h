// The `decoder` section of HF tokenizer.json: turns token strings back into
// text. ByteLevel, ByteFallback, Metaspace, Replace, Strip, Fuse and Sequence,
// each following HF's decode_chain so that decode() matches HF exactly.
//
// Thread safety: immutable after construction.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom {

class Decoder {
 public:
  // Throws Error(kUnsupported) naming `context` for an unknown type.
  static Decoder from_json(const nlohmann::json& config, const std::string& context);

  // HF's Decoder::decode: the chain over all token strings, then joined.
  std::string decode(std::vector<std::string> tokens) const;
  // The raw bytes one token stands for, before UTF-8 validation (may be a
  // partial character). Used for streaming.
  std::string token_bytes(const std::string& token) const;
  bool empty() const { return steps_.empty(); }

 private:
  enum class Kind { kByteLevel, kByteFallback, kMetaspace, kReplace, kStrip, kFuse };
  struct Step {
    Kind kind;
    std::string pattern;      // Replace: literal; Metaspace: replacement; Strip: content
    std::string content;      // Replace
    bool metaspace_drops_first = true;  // Metaspace: prepend_scheme != never
    size_t strip_start = 0, strip_stop = 0;
  };
  static void append_steps(const nlohmann::json& config, const std::string& context, std::vector<Step>& steps);
  static void apply(const Step& step, std::vector<std::string>& tokens);
  std::vector<Step> steps_;
};

}  // namespace loom
