#include "tokenizer/families.h"

namespace loom {
namespace {

constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

nlohmann::json byte_level_json(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}

nlohmann::json split_json(const char* pattern) {
  return {{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}};
}

}  // namespace

const char* family_name(PreTokenizerFamily family) {
  switch (family) {
    case PreTokenizerFamily::kGpt2: return "gpt2";
    case PreTokenizerFamily::kLlama3: return "llama3";
    case PreTokenizerFamily::kQwen2: return "qwen2";
    case PreTokenizerFamily::kSmolLM: return "smollm";
  }
  return "gpt2";
}

std::optional<PreTokenizerFamily> family_from_gguf_pre(const std::string& pre) {
  if (pre.empty() || pre == "default" || pre == "gpt-2" || pre == "gpt2") return PreTokenizerFamily::kGpt2;
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3") return PreTokenizerFamily::kLlama3;
  if (pre == "qwen2") return PreTokenizerFamily::kQwen2;
  if (pre == "smollm") return PreTokenizerFamily::kSmolLM;
  return std::nullopt;
}

const char* gguf_pre_name(PreTokenizerFamily family) {
  switch (family) {
    case PreTokenizerFamily::kGpt2: return "gpt-2";
    case PreTokenizerFamily::kLlama3: return "llama-bpe";
    case PreTokenizerFamily::kQwen2: return "qwen2";
    case PreTokenizerFamily::kSmolLM: return "smollm";
  }
  return "gpt-2";
}

nlohmann::json family_normalizer_json(PreTokenizerFamily family) {
  if (family == PreTokenizerFamily::kQwen2) return {{"type", "NFC"}};
  return nullptr;
}

nlohmann::json family_pre_tokenizer_json(PreTokenizerFamily family) {
  switch (family) {
    case PreTokenizerFamily::kGpt2:
      return byte_level_json(true);
    case PreTokenizerFamily::kLlama3:
      return {{"type", "Sequence"}, {"pretokenizers", {split_json(kLlama3Pattern), byte_level_json(false)}}};
    case PreTokenizerFamily::kQwen2:
      return {{"type", "Sequence"}, {"pretokenizers", {split_json(kQwen2Pattern), byte_level_json(false)}}};
    case PreTokenizerFamily::kSmolLM:
      return {{"type", "Sequence"},
              {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level_json(true)}}};
  }
  return nullptr;
}

bool family_ignores_merges(PreTokenizerFamily family) { return family == PreTokenizerFamily::kLlama3; }

nlohmann::json byte_level_bpe_model_json(nlohmann::json vocab, nlohmann::json merges, PreTokenizerFamily family) {
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", false},
          {"byte_fallback", false},
          {"ignore_merges", family_ignores_merges(family)},
          {"vocab", std::move(vocab)},
          {"merges", std::move(merges)}};
}

nlohmann::json byte_level_decoder_json() {
  return {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
}

}  // namespace loom
