// GGUF vocabulary (tokenizer.ggml.*) -> Hugging Face tokenizer JSON.
//
// Mapping: token_type 3 (control) -> added token, special; 4 (user defined) ->
// added token, not special; both matched on raw text (normalized: false).
// tokenizer.ggml.pre picks the pre-tokenizer family (families.h); an unknown
// name falls back to the GPT-2 regex with a warning. add_bos_token (default:
// true for Llama-3 vocabularies) becomes a TemplateProcessing post-processor.
#pragma once

#include <nlohmann/json.hpp>

namespace loom {

struct GgufFile;

struct GgufTokenizerJson {
  nlohmann::json tokenizer_json;
  nlohmann::json config_json;
};

// Throws Error(kUnsupported) for a tokenizer.ggml.model other than "gpt2",
// Error(kFormat) naming the file and key for missing or ill-typed metadata.
GgufTokenizerJson gguf_tokenizer_json(const GgufFile& gguf);

}  // namespace loom
