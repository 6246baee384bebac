// A deterministic synthetic tokenizer for random test models (`loom make-model`).
//
// A tiny byte-level BPE trained on a built-in corpus (English, code, digits,
// some unicode), in the layout of a model family:
//   ids [0, 256)              the 256 byte-level tokens, id == byte value
//   ids [256, 256 + merges)   merge results, in merge order
//   then                      inert filler tokens "<|reserved_N|>" (plain vocabulary
//                             entries no merge reaches) when the corpus runs out of merges
//   last ids                  the family's special tokens, in this order:
//     llama3: <|begin_of_text|> <|end_of_text|> <|start_header_id|> <|end_header_id|> <|eot_id|>
//     qwen2, smollm (ChatML): <|endoftext|> <|im_start|> <|im_end|>
// The vocabulary has exactly vocab_size ids. HF `tokenizers` loads the JSON and
// encodes as Loom does (tests/fixtures/tokenizer/synthetic_*).
#pragma once

#include <string>
#include <vector>

#include "tokenizer/families.h"

namespace loom {

using SyntheticPreTokenizer = PreTokenizerFamily;  // kLlama3, kQwen2, kSmolLM (kGpt2 also works)

struct SyntheticTokenizer {
  std::string tokenizer_json;
  std::string tokenizer_config_json;  // chat template, bos/eos, add_bos_token
  int bos_token_id = -1;              // llama3: <|begin_of_text|>; ChatML families: <|endoftext|>
  std::vector<int> eos_token_ids;     // llama3: <|eot_id|>, <|end_of_text|>; ChatML: <|im_end|>, <|endoftext|>
                                      // (the first is tokenizer_config.json's eos_token)
};

// Throws Error(kInvalidArgument) if vocab_size < 256 + the number of special
// tokens. Deterministic: the same arguments always give the same bytes.
SyntheticTokenizer make_synthetic_tokenizer(int vocab_size, SyntheticPreTokenizer kind);

std::string make_synthetic_tokenizer_json(int vocab_size, SyntheticPreTokenizer kind);
std::string make_synthetic_tokenizer_config_json(int vocab_size, SyntheticPreTokenizer kind);

// The training corpus (a few KB).
const char* synthetic_tokenizer_corpus();

}  // namespace loom
