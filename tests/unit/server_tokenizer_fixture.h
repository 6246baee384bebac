// A small synthetic ChatML tokenizer for server tests (no model needed).
#pragma once

#include <fstream>
#include <memory>

#include "synthetic/synthetic_tokenizer.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace loom::test {

inline std::shared_ptr<const Tokenizer> make_server_test_tokenizer() {
  TempDir directory;
  const SyntheticTokenizer synthetic = make_synthetic_tokenizer(512, SyntheticPreTokenizer::kSmolLM);
  std::ofstream(directory.path() / "tokenizer.json") << synthetic.tokenizer_json;
  std::ofstream(directory.path() / "tokenizer_config.json") << synthetic.tokenizer_config_json;
  return Tokenizer::from_hf_directory(directory.str());
}

}  // namespace loom::test
