// The pre-tokenization conventions of the model families Loom serves, as the
// HF tokenizer.json sections they use. Shared by the GGUF importer (which
// knows a family only by tokenizer.ggml.pre) and the synthetic tokenizer.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace loom {

enum class PreTokenizerFamily {
  kGpt2,    // ByteLevel with the GPT-2 regex
  kLlama3,  // Split(Llama-3 regex, digits in runs of 1-3) + ByteLevel; ignore_merges
  kQwen2,   // NFC + Split(Qwen2 regex, single digits) + ByteLevel
  kSmolLM,  // Digits(individual) + ByteLevel with the GPT-2 regex
};

const char* family_name(PreTokenizerFamily family);
// tokenizer.ggml.pre -> family; nullopt for a name we do not know.
std::optional<PreTokenizerFamily> family_from_gguf_pre(const std::string& pre);
// The tokenizer.ggml.pre value llama.cpp uses for the family.
const char* gguf_pre_name(PreTokenizerFamily family);

nlohmann::json family_normalizer_json(PreTokenizerFamily family);
nlohmann::json family_pre_tokenizer_json(PreTokenizerFamily family);
bool family_ignores_merges(PreTokenizerFamily family);
// ByteLevel decoder JSON (all families decode the same way).
nlohmann::json byte_level_decoder_json();
// The "model" object of a byte-level BPE tokenizer.json (no unk, no byte fallback).
nlohmann::json byte_level_bpe_model_json(nlohmann::json vocab, nlohmann::json merges, PreTokenizerFamily family);

}  // namespace loom
