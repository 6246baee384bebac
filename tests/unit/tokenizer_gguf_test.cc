// Tokenizer::from_gguf: metadata mapping on in-memory GgufFiles, and the real
// SmolLM2 GGUF against HF `tokenizers` (expected ids from make_fixtures.py,
// which rebuilds SmolLM2's HF tokenizer from the same metadata).
#include <cstring>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "formats/gguf.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace loom {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream buffer;
  buffer << file.rdbuf();
  return buffer.str();
}

// Reads only the metadata of a GGUF file (v2/v3), so this test does not
// depend on the model reader nor pay for dequantizing the weights.
class GgufMetadataReader {
 public:
  explicit GgufMetadataReader(const std::string& path) : file_(path, std::ios::binary) {}

  GgufFile read(const std::string& path) {
    GgufFile gguf;
    gguf.path = path;
    char magic[4];
    file_.read(magic, 4);
    if (std::memcmp(magic, "GGUF", 4) != 0) throw std::runtime_error("not a GGUF file");
    gguf.version = scalar<uint32_t>();
    scalar<uint64_t>();  // tensor count
    const uint64_t num_keys = scalar<uint64_t>();
    for (uint64_t i = 0; i < num_keys; ++i) {
      std::string key = string();
      gguf.metadata[key] = value(scalar<uint32_t>());
    }
    return gguf;
  }

 private:
  template <typename T>
  T scalar() {
    T value{};
    file_.read(reinterpret_cast<char*>(&value), sizeof(T));
    if (!file_) throw std::runtime_error("truncated GGUF metadata");
    return value;
  }
  std::string string() {
    std::string text(scalar<uint64_t>(), '\0');
    file_.read(text.data(), static_cast<std::streamsize>(text.size()));
    return text;
  }
  int64_t integer(uint32_t type) {
    switch (type) {
      case 0: return scalar<uint8_t>();
      case 1: return scalar<int8_t>();
      case 2: return scalar<uint16_t>();
      case 3: return scalar<int16_t>();
      case 4: return scalar<uint32_t>();
      case 5: return scalar<int32_t>();
      case 10: return static_cast<int64_t>(scalar<uint64_t>());
      case 11: return scalar<int64_t>();
      default: throw std::runtime_error("not an integer type");
    }
  }
  GgufValue value(uint32_t type) {
    switch (type) {
      case 6: return static_cast<double>(scalar<float>());
      case 12: return scalar<double>();
      case 7: return scalar<uint8_t>() != 0;
      case 8: return string();
      case 9: {
        const uint32_t item_type = scalar<uint32_t>();
        const uint64_t count = scalar<uint64_t>();
        if (item_type == 8) {
          std::vector<std::string> items(count);
          for (auto& item : items) item = string();
          return items;
        }
        if (item_type == 6 || item_type == 12) {
          std::vector<double> items(count);
          for (auto& item : items) item = item_type == 6 ? scalar<float>() : scalar<double>();
          return items;
        }
        std::vector<int64_t> items(count);
        for (auto& item : items) item = integer(item_type);
        return items;
      }
      default: return integer(type);
    }
  }
  std::ifstream file_;
};

// A tiny vocabulary: bytes a..e, merges, two control tokens and one user-defined.
GgufFile tiny_gguf(const std::string& pre) {
  GgufFile gguf;
  gguf.path = "tiny.gguf";
  gguf.metadata["tokenizer.ggml.model"] = std::string("gpt2");
  gguf.metadata["tokenizer.ggml.pre"] = pre;
  gguf.metadata["tokenizer.ggml.tokens"] =
      std::vector<std::string>{"<s>", "</s>", "a", "b", "c", "1", "2", "Ġ", "ab", "abc", "Ġa", "12", "<tool>"};
  gguf.metadata["tokenizer.ggml.token_type"] = std::vector<int64_t>{3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 4};
  gguf.metadata["tokenizer.ggml.merges"] = std::vector<std::string>{"a b", "ab c", "Ġ a", "1 2"};
  gguf.metadata["tokenizer.ggml.bos_token_id"] = uint64_t{0};
  gguf.metadata["tokenizer.ggml.eos_token_id"] = uint64_t{1};
  return gguf;
}

TEST(TokenizerGgufTest, MapsTokenTypesAndMerges) {
  const auto tokenizer = Tokenizer::from_gguf(tiny_gguf("gpt-2"));
  EXPECT_EQ(tokenizer->vocab_size(), 13);
  EXPECT_TRUE(tokenizer->is_special(0));
  EXPECT_TRUE(tokenizer->is_special(1));
  EXPECT_FALSE(tokenizer->is_special(12));  // user defined: split out, not special
  EXPECT_EQ(tokenizer->encode("abc</s><tool>", false), (std::vector<TokenId>{9, 1, 12}));
  EXPECT_EQ(tokenizer->encode(" a", false), (std::vector<TokenId>{10}));
  EXPECT_EQ(tokenizer->bos_token_id(), 0);
  EXPECT_EQ(tokenizer->eos_token_ids().front(), 1);
  EXPECT_EQ(tokenizer->encode("ab", true), (std::vector<TokenId>{8}));  // gpt-2: no BOS by default
  EXPECT_EQ(tokenizer->decode({9, 1, 12}, true), "abc<tool>");
}

TEST(TokenizerGgufTest, PreTokenizerFollowsPreName) {
  // gpt-2 keeps digit runs together ("12" merges); smollm splits digits one by one.
  EXPECT_EQ(Tokenizer::from_gguf(tiny_gguf("gpt-2"))->encode("12", false), (std::vector<TokenId>{11}));
  EXPECT_EQ(Tokenizer::from_gguf(tiny_gguf("smollm"))->encode("12", false), (std::vector<TokenId>{5, 6}));
  // Unknown names fall back to GPT-2 with a warning.
  EXPECT_EQ(Tokenizer::from_gguf(tiny_gguf("mystery"))->encode("12", false), (std::vector<TokenId>{11}));
}

TEST(TokenizerGgufTest, AddBosFollowsMetadata) {
  GgufFile gguf = tiny_gguf("llama-bpe");
  EXPECT_EQ(Tokenizer::from_gguf(gguf)->encode("ab", true), (std::vector<TokenId>{0, 8}));  // llama-bpe default
  gguf.metadata["tokenizer.ggml.add_bos_token"] = false;
  EXPECT_EQ(Tokenizer::from_gguf(gguf)->encode("ab", true), (std::vector<TokenId>{8}));
  gguf = tiny_gguf("gpt-2");
  gguf.metadata["tokenizer.ggml.add_bos_token"] = true;
  EXPECT_EQ(Tokenizer::from_gguf(gguf)->encode("ab", true), (std::vector<TokenId>{0, 8}));
  EXPECT_NE(Tokenizer::from_gguf(gguf)->to_hf_tokenizer_config_json().find("\"add_bos_token\": true"),
            std::string::npos);
}

TEST(TokenizerGgufTest, BadMetadataRaisesFormatErrors) {
  GgufFile gguf = tiny_gguf("gpt-2");
  gguf.metadata["tokenizer.ggml.model"] = std::string("llama");
  try {
    Tokenizer::from_gguf(gguf);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(error.what()).find("tiny.gguf"), std::string::npos);
  }
  gguf = tiny_gguf("gpt-2");
  gguf.metadata["tokenizer.ggml.merges"] = std::vector<std::string>{"a zz"};
  EXPECT_THROW(Tokenizer::from_gguf(gguf), Error);
  gguf = tiny_gguf("gpt-2");
  gguf.metadata["tokenizer.ggml.token_type"] = std::vector<int64_t>{1, 1};
  EXPECT_THROW(Tokenizer::from_gguf(gguf), Error);
  gguf = tiny_gguf("gpt-2");
  gguf.metadata.erase("tokenizer.ggml.tokens");
  try {
    Tokenizer::from_gguf(gguf);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kFormat);
    EXPECT_NE(std::string(error.what()).find("tokenizer.ggml.tokens"), std::string::npos);
  }
}

class SmolLM2GgufTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = test::smollm2_gguf_path();
    if (path.empty()) GTEST_SKIP() << "SmolLM2 GGUF not found (set LOOM_SMOLLM2_GGUF)";
    tokenizer_ = Tokenizer::from_gguf(GgufMetadataReader(path).read(path));
  }
  std::shared_ptr<const Tokenizer> tokenizer_;
};

TEST_F(SmolLM2GgufTest, MatchesHfOnCorpus) {
  const auto corpus = nlohmann::json::parse(read_text(test::fixture_path("tokenizer/corpus.json")));
  const auto expected = nlohmann::json::parse(read_text(test::fixture_path("tokenizer/expected/smollm2.json")));
  ASSERT_EQ(corpus.size(), expected.at("cases").size());
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::string text = corpus[i].get<std::string>();
    const auto& want = expected["cases"][i];
    SCOPED_TRACE("case " + std::to_string(i) + ": " + text);
    EXPECT_EQ(tokenizer_->encode(text, false), want.at("ids").get<std::vector<TokenId>>());
    const auto with_special = want.at("ids_with_special").get<std::vector<TokenId>>();
    EXPECT_EQ(tokenizer_->encode(text, true), with_special);
    EXPECT_EQ(tokenizer_->decode(with_special, false), want.at("decoded").get<std::string>());
    EXPECT_EQ(tokenizer_->decode(with_special, true), want.at("decoded_skip_special").get<std::string>());
  }
}

TEST_F(SmolLM2GgufTest, SpecialTokensAndChatTemplate) {
  EXPECT_EQ(tokenizer_->vocab_size(), 49152);
  EXPECT_EQ(tokenizer_->bos_token_id(), 1);
  const auto eos = tokenizer_->eos_token_ids();
  ASSERT_FALSE(eos.empty());
  EXPECT_EQ(eos.front(), 2);  // <|im_end|>
  EXPECT_EQ(tokenizer_->token_text(2), "<|im_end|>");
  EXPECT_EQ(tokenizer_->chat_template().kind(), ChatTemplate::Kind::kChatML);
  const auto fixture = nlohmann::json::parse(read_text(test::fixture_path("tokenizer/chat_templates.json")));
  EXPECT_EQ(tokenizer_->chat_template().jinja(), fixture.at("smollm2").at("template").get<std::string>());
  for (const auto& c : fixture["smollm2"]["cases"]) {
    std::vector<ChatMessage> messages;
    for (const auto& m : c["messages"]) messages.push_back({m["role"], m["content"]});
    EXPECT_EQ(tokenizer_->chat_template().render(messages, c["add_generation_prompt"].get<bool>()),
              c["expected"].get<std::string>());
  }
  // A rendered prompt tokenizes its markers as single special tokens.
  const auto ids = tokenizer_->encode(tokenizer_->chat_template().render({{"user", "Hi"}}), false);
  EXPECT_EQ(ids.front(), 1);
}

TEST_F(SmolLM2GgufTest, ExportReloadsIdentically) {
  test::TempDir dir;
  std::ofstream(dir.str() + "/tokenizer.json") << tokenizer_->to_hf_tokenizer_json();
  std::ofstream(dir.str() + "/tokenizer_config.json") << tokenizer_->to_hf_tokenizer_config_json();
  const auto reloaded = Tokenizer::from_hf_directory(dir.str());
  const auto corpus = nlohmann::json::parse(read_text(test::fixture_path("tokenizer/corpus.json")));
  for (const auto& text : corpus) EXPECT_EQ(reloaded->encode(text.get<std::string>()), tokenizer_->encode(text.get<std::string>()));
  EXPECT_EQ(reloaded->chat_template().jinja(), tokenizer_->chat_template().jinja());
  EXPECT_EQ(reloaded->eos_token_ids(), tokenizer_->eos_token_ids());
}

}  // namespace
}  // namespace loom
