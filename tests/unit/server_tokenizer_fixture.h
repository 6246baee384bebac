// A small synthetic ChatML tokenizer for server tests (no model needed).
#pragma once

#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "synthetic/synthetic_tokenizer.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace loom::test {

// think_tokens: <think> and </think> added as tokens 512 and 513 (a reasoning model's vocabulary).
inline std::shared_ptr<const Tokenizer> make_server_test_tokenizer(bool think_tokens = false) {
  TempDir directory;
  const SyntheticTokenizer synthetic = make_synthetic_tokenizer(512, SyntheticPreTokenizer::kSmolLM);
  nlohmann::json tokenizer_json = nlohmann::json::parse(synthetic.tokenizer_json);
  if (think_tokens)
    for (const auto& [id, content] : {std::pair{512, "<think>"}, std::pair{513, "</think>"}})
      tokenizer_json["added_tokens"].push_back({{"id", id}, {"content", content}, {"single_word", false},
                                                {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                                                {"special", false}});
  std::ofstream(directory.path() / "tokenizer.json") << tokenizer_json.dump();
  std::ofstream(directory.path() / "tokenizer_config.json") << synthetic.tokenizer_config_json;
  return Tokenizer::from_hf_directory(directory.str());
}

}  // namespace loom::test
