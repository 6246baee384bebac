// The synthetic tokenizer of `loom make-model`, and the tokenizer.json Loom
// exports for a GGUF vocabulary: exact sizes, determinism, and agreement with
// HF `tokenizers` on the corpus (expected ids from tools/tokenizer/make_fixtures.py).
//
// Regenerating the committed Loom-written fixtures:
//   LOOM_WRITE_TOKENIZER_FIXTURES=1 build-*/tokenizer_synthetic_test && python3 tools/tokenizer/make_fixtures.py
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "formats/gguf.h"
#include "synthetic/synthetic_tokenizer.h"
#include "test_util.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace loom {
namespace {

constexpr int kFixtureVocabSize = 512;

std::string read_text(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream buffer;
  buffer << file.rdbuf();
  return buffer.str();
}

bool should_write_fixtures() {
  const char* value = std::getenv("LOOM_WRITE_TOKENIZER_FIXTURES");
  return value != nullptr && std::string(value) == "1";
}

// Compares `text` with the committed fixture, or rewrites the fixture on request.
void expect_golden(const std::string& name, const std::string& text) {
  const std::string path = test::fixture_path("tokenizer/" + name);
  if (should_write_fixtures()) {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  }
  EXPECT_EQ(read_text(path), text) << name << " changed: regenerate the fixtures (see the file comment)";
}

void expect_matches_hf(const Tokenizer& tokenizer, const std::string& expected_name) {
  const auto corpus = nlohmann::json::parse(read_text(test::fixture_path("tokenizer/corpus.json")));
  const auto expected =
      nlohmann::json::parse(read_text(test::fixture_path("tokenizer/expected/" + expected_name + ".json")));
  ASSERT_EQ(corpus.size(), expected.at("cases").size());
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::string text = corpus[i].get<std::string>();
    const auto& want = expected["cases"][i];
    SCOPED_TRACE("case " + std::to_string(i) + ": " + text);
    EXPECT_EQ(tokenizer.encode(text, false), want.at("ids").get<std::vector<TokenId>>());
    const auto with_special = want.at("ids_with_special").get<std::vector<TokenId>>();
    EXPECT_EQ(tokenizer.encode(text, true), with_special);
    EXPECT_EQ(tokenizer.decode(with_special, false), want.at("decoded").get<std::string>());
    EXPECT_EQ(tokenizer.decode(with_special, true), want.at("decoded_skip_special").get<std::string>());
  }
}

std::shared_ptr<const Tokenizer> load_synthetic(int vocab_size, SyntheticPreTokenizer kind) {
  const SyntheticTokenizer synthetic = make_synthetic_tokenizer(vocab_size, kind);
  return std::make_shared<HfTokenizer>(nlohmann::json::parse(synthetic.tokenizer_json),
                                       nlohmann::json::parse(synthetic.tokenizer_config_json), "synthetic");
}

// The synthetic vocabulary as GGUF metadata, as llama.cpp's converter writes it.
GgufFile gguf_from_tokenizer_json(const std::string& tokenizer_json, const std::string& pre) {
  const auto spec = nlohmann::json::parse(tokenizer_json);
  std::vector<std::string> tokens(spec["model"]["vocab"].size());
  for (const auto& [token, id] : spec["model"]["vocab"].items()) tokens.at(id.get<size_t>()) = token;
  std::vector<int64_t> token_types(tokens.size(), 1);
  for (const auto& added : spec["added_tokens"]) token_types.at(added["id"].get<size_t>()) = 3;
  std::vector<std::string> merges;
  for (const auto& merge : spec["model"]["merges"])
    merges.push_back(merge[0].get<std::string>() + " " + merge[1].get<std::string>());
  GgufFile gguf;
  gguf.path = "in-memory.gguf";
  gguf.metadata["tokenizer.ggml.model"] = std::string("gpt2");
  gguf.metadata["tokenizer.ggml.pre"] = pre;
  gguf.metadata["tokenizer.ggml.tokens"] = tokens;
  gguf.metadata["tokenizer.ggml.token_type"] = token_types;
  gguf.metadata["tokenizer.ggml.merges"] = merges;
  gguf.metadata["tokenizer.ggml.bos_token_id"] = static_cast<uint64_t>(tokens.size() - 3);
  gguf.metadata["tokenizer.ggml.eos_token_id"] = static_cast<uint64_t>(tokens.size() - 1);
  gguf.metadata["tokenizer.ggml.add_bos_token"] = false;
  return gguf;
}

struct KindCase {
  SyntheticPreTokenizer kind;
  const char* name;
};

class SyntheticTokenizerTest : public ::testing::TestWithParam<KindCase> {};

TEST_P(SyntheticTokenizerTest, VocabularyIsExactAndSpecialTokensAreLast) {
  for (int vocab_size : {264, kFixtureVocabSize, 5000}) {
    const SyntheticTokenizer synthetic = make_synthetic_tokenizer(vocab_size, GetParam().kind);
    const auto tokenizer = load_synthetic(vocab_size, GetParam().kind);
    EXPECT_EQ(tokenizer->vocab_size(), vocab_size);
    EXPECT_EQ(nlohmann::json::parse(synthetic.tokenizer_json)["model"]["vocab"].size(), static_cast<size_t>(vocab_size));
    EXPECT_TRUE(tokenizer->is_special(vocab_size - 1));
    EXPECT_FALSE(tokenizer->is_special(0));
    EXPECT_EQ(tokenizer->token_bytes(' '), " ");  // byte tokens: id == byte value
    EXPECT_EQ(tokenizer->bos_token_id(), synthetic.bos_token_id);
    for (int eos : synthetic.eos_token_ids) {
      const auto eos_ids = tokenizer->eos_token_ids();
      EXPECT_NE(std::find(eos_ids.begin(), eos_ids.end(), eos), eos_ids.end());
    }
  }
}

TEST_P(SyntheticTokenizerTest, IsDeterministicAndRoundTrips) {
  EXPECT_EQ(make_synthetic_tokenizer_json(kFixtureVocabSize, GetParam().kind),
            make_synthetic_tokenizer_json(kFixtureVocabSize, GetParam().kind));
  const auto tokenizer = load_synthetic(2000, GetParam().kind);
  const std::string text = "The server streams 12345 tokens; café 😀 naïve\n\tdef f(x): return x";
  const auto ids = tokenizer->encode(text, false);
  EXPECT_LT(ids.size(), text.size() / 2) << "merges should compress ordinary text";
  EXPECT_EQ(tokenizer->decode(ids), text);
}

TEST_P(SyntheticTokenizerTest, MatchesHfOnCorpus) {
  const SyntheticTokenizer synthetic = make_synthetic_tokenizer(kFixtureVocabSize, GetParam().kind);
  const std::string name = std::string("synthetic_") + GetParam().name;
  expect_golden(name + "/tokenizer.json", synthetic.tokenizer_json);
  expect_golden(name + "/tokenizer_config.json", synthetic.tokenizer_config_json);
  expect_matches_hf(*load_synthetic(kFixtureVocabSize, GetParam().kind), name);
  // The committed files load from disk with their config (chat template, eos).
  const auto from_file = Tokenizer::from_hf_json_file(test::fixture_path("tokenizer/" + name + "/tokenizer.json"));
  EXPECT_EQ(from_file->chat_template().jinja(), load_synthetic(kFixtureVocabSize, GetParam().kind)->chat_template().jinja());
  EXPECT_EQ(from_file->eos_token_ids(), std::vector<TokenId>(synthetic.eos_token_ids.begin(), synthetic.eos_token_ids.end()));
}

TEST_P(SyntheticTokenizerTest, ChatTemplateMatchesFamily) {
  const auto tokenizer = load_synthetic(kFixtureVocabSize, GetParam().kind);
  const std::string rendered = tokenizer->chat_template().render({{"user", "Hi"}}, true);
  if (GetParam().kind == SyntheticPreTokenizer::kLlama3) {
    EXPECT_EQ(rendered, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  } else {
    EXPECT_NE(rendered.find("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"), std::string::npos);
  }
  // Rendered special tokens encode as single ids.
  const auto ids = tokenizer->encode(rendered, false);
  EXPECT_TRUE(tokenizer->is_special(ids.front()));
}

INSTANTIATE_TEST_SUITE_P(Families, SyntheticTokenizerTest,
                         ::testing::Values(KindCase{SyntheticPreTokenizer::kLlama3, "llama3"},
                                           KindCase{SyntheticPreTokenizer::kQwen2, "qwen2"},
                                           KindCase{SyntheticPreTokenizer::kSmolLM, "smollm"}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(SyntheticTokenizerTest, RejectsTooSmallVocabulary) {
  try {
    make_synthetic_tokenizer(260, SyntheticPreTokenizer::kLlama3);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kInvalidArgument);
  }
}

// GGUF (qwen2 pre) -> Loom -> tokenizer.json: HF loads the export and agrees
// with Loom's encoding of the GGUF vocabulary; Loom re-loading it agrees too.
TEST(TokenizerExportTest, GgufExportMatchesHf) {
  const std::string source = make_synthetic_tokenizer_json(kFixtureVocabSize, SyntheticPreTokenizer::kQwen2);
  const auto from_gguf = Tokenizer::from_gguf(gguf_from_tokenizer_json(source, "qwen2"));
  const std::string exported = from_gguf->to_hf_tokenizer_json();
  expect_golden("gguf_export/tokenizer.json", exported);
  expect_matches_hf(*from_gguf, "gguf_export");
  const auto reloaded = std::make_shared<HfTokenizer>(
      nlohmann::json::parse(exported), nlohmann::json::parse(from_gguf->to_hf_tokenizer_config_json()), "export");
  expect_matches_hf(*reloaded, "gguf_export");
  EXPECT_EQ(reloaded->to_hf_tokenizer_json(), exported);
}

}  // namespace
}  // namespace loom
