// Loom's tokenizer against HF `tokenizers` on tricky strings: ids (with and
// without special tokens) and decodes must match exactly. Expected values come
// from tools/tokenizer/make_fixtures.py.
#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "util/error.h"

namespace loom {
namespace {

nlohmann::json read_fixture(const std::string& name) {
  std::ifstream file(test::fixture_path("tokenizer/" + name));
  EXPECT_TRUE(file.good()) << name;
  std::stringstream buffer;
  buffer << file.rdbuf();
  return nlohmann::json::parse(buffer.str());
}

// Compares every corpus string; returns the number of mismatching cases.
void expect_matches_hf(const Tokenizer& tokenizer, const std::string& expected_name) {
  const nlohmann::json corpus = read_fixture("corpus.json");
  const nlohmann::json expected = read_fixture("expected/" + expected_name + ".json");
  ASSERT_EQ(corpus.size(), expected.at("cases").size()) << "regenerate fixtures";
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

std::shared_ptr<const Tokenizer> load(const std::string& name) {
  return Tokenizer::from_hf_json_file(test::fixture_path("tokenizer/" + name + "/tokenizer.json"));
}

TEST(TokenizerHfTest, WordCacheStaysWithinItsLimitUnderAFloodOfDistinctWords) {
  const auto tokenizer = load("llama3_pattern");
  std::string text;
  int64_t capacity = 0;
  for (int batch = 0; batch < 30; ++batch) {
    text.clear();
    for (int i = 0; i < 1000; ++i) {
      text += " q";  // a distinct word of letters (digits would split into groups of three)
      for (int n = batch * 1000 + i; n > 0; n /= 26) text += static_cast<char>('a' + n % 26);
    }
    tokenizer->encode(text);
    const std::vector<CacheGauge> gauges = tokenizer->cache_gauges();
    ASSERT_EQ(gauges.size(), 1u);
    EXPECT_EQ(gauges[0].name, "bpe_words");
    capacity = gauges[0].capacity;
    EXPECT_GT(gauges[0].entries, 0);
    EXPECT_LE(gauges[0].entries, capacity);
    EXPECT_GT(gauges[0].bytes, 0);
  }
  EXPECT_LT(capacity, 30000);  // the flood was larger than the limit, so it must have evicted
  EXPECT_GT(tokenizer->cache_gauges()[0].evictions, 0);
}

TEST(TokenizerHfTest, Llama3PatternMatchesHf) { expect_matches_hf(*load("llama3_pattern"), "llama3_pattern"); }

TEST(TokenizerHfTest, Qwen2PatternWithNfcMatchesHf) { expect_matches_hf(*load("qwen2_pattern"), "qwen2_pattern"); }

TEST(TokenizerHfTest, Gpt2PrefixSpaceWithNfkcLowercaseMatchesHf) {
  expect_matches_hf(*load("gpt2_prefix_space"), "gpt2_prefix_space");
}

TEST(TokenizerHfTest, SplitBehaviorsMatchHf) { expect_matches_hf(*load("split_behaviors"), "split_behaviors"); }

TEST(TokenizerHfTest, ByteFallbackMatchesHf) { expect_matches_hf(*load("byte_fallback"), "byte_fallback"); }

TEST(TokenizerHfTest, MetaspaceWithUnkMatchesHf) { expect_matches_hf(*load("metaspace"), "metaspace"); }

// to_hf_tokenizer_json() of a loaded tokenizer.json encodes identically (HF
// loading these exports was checked when the fixtures were made) and is stable.
TEST(TokenizerHfTest, ExportReloadsIdentically) {
  for (const char* name : {"llama3_pattern", "qwen2_pattern", "byte_fallback", "metaspace", "gpt2_prefix_space",
                           "split_behaviors"}) {
    SCOPED_TRACE(name);
    const auto original = load(name);
    test::TempDir dir;
    std::ofstream(dir.str() + "/tokenizer.json") << original->to_hf_tokenizer_json();
    std::ofstream(dir.str() + "/tokenizer_config.json") << original->to_hf_tokenizer_config_json();
    const auto reloaded = Tokenizer::from_hf_directory(dir.str());
    expect_matches_hf(*reloaded, name);
    EXPECT_EQ(reloaded->to_hf_tokenizer_json(), original->to_hf_tokenizer_json());
  }
}

TEST(TokenizerHfTest, ByteLevelRoundTripsEveryString) {
  const auto tokenizer = load("llama3_pattern");
  for (const auto& value : read_fixture("corpus.json")) {
    const std::string text = value.get<std::string>();
    if (text.find("[MASK]") != std::string::npos) continue;  // lstrip/rstrip drop spaces by design
    EXPECT_EQ(tokenizer->decode(tokenizer->encode(text, false)), text);
  }
}

TEST(TokenizerHfTest, Llama3AddsBosAndKnowsSpecialTokens) {
  const auto tokenizer = load("llama3_pattern");
  const auto bos = tokenizer->token_to_id("<|begin_of_text|>");
  ASSERT_TRUE(bos.has_value());
  EXPECT_EQ(tokenizer->bos_token_id(), bos);
  const auto ids = tokenizer->encode("Hello", true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), *bos);
  EXPECT_TRUE(tokenizer->is_special(*bos));
  EXPECT_FALSE(tokenizer->is_special(tokenizer->encode("Hello", false).front()));
  const auto eot = tokenizer->token_to_id("<|eot_id|>");
  ASSERT_TRUE(eot.has_value());
  const auto eos = tokenizer->eos_token_ids();
  EXPECT_NE(std::find(eos.begin(), eos.end(), *eot), eos.end());
  EXPECT_EQ(tokenizer->chat_template().kind(), ChatTemplate::Kind::kChatML);  // no config: default
}

TEST(TokenizerHfTest, IgnoreMergesEmitsWholeVocabularyWords) {
  // "Ġunreachable" is in the vocabulary but no merge chain produces it.
  const auto tokenizer = load("llama3_pattern");
  const auto id = tokenizer->token_to_id("Ġunreachable");
  ASSERT_TRUE(id.has_value());
  EXPECT_EQ(tokenizer->encode(" unreachable", false), std::vector<TokenId>{*id});
}

TEST(TokenizerHfTest, InvalidUtf8InputIsReplacedNotFatal) {
  const auto tokenizer = load("llama3_pattern");
  const std::string invalid = std::string("ab") + static_cast<char>(0xFF) + "cd";
  EXPECT_EQ(tokenizer->decode(tokenizer->encode(invalid, false)), "ab\xEF\xBF\xBD" "cd");
}

TEST(TokenizerHfTest, DecodeReplacesInvalidTrailingBytes) {
  const auto tokenizer = load("llama3_pattern");
  // "😀" is 4 bytes; its first byte-level token alone is an incomplete character.
  const auto ids = tokenizer->encode("😀", false);
  ASSERT_GE(ids.size(), 1u);
  const std::string first_bytes = tokenizer->token_bytes(ids[0]);
  ASSERT_LT(first_bytes.size(), 4u);
  EXPECT_EQ(tokenizer->decode({ids[0]}), "\xEF\xBF\xBD");
}

TEST(TokenizerHfTest, MalformedFilesRaiseTypedErrors) {
  test::TempDir dir;
  const std::string path = dir.str() + "/tokenizer.json";
  std::ofstream(path) << "{ not json";
  try {
    Tokenizer::from_hf_json_file(path);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kFormat);
    EXPECT_NE(std::string(error.what()).find(path), std::string::npos);
  }
  std::ofstream(path, std::ios::trunc) << R"({"model": {"type": "Unigram", "vocab": []}})";
  try {
    Tokenizer::from_hf_json_file(path);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kUnsupported);
  }
  std::ofstream(path, std::ios::trunc) << R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})";
  try {
    Tokenizer::from_hf_json_file(path);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kFormat);
  }
  try {
    Tokenizer::from_hf_directory(dir.str() + "/missing");
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kNotFound);
  }
}

TEST(TokenizerHfTest, DirectoryLoadReadsConfigAndChatTemplate) {
  test::TempDir dir;
  {
    std::ifstream source(test::fixture_path("tokenizer/qwen2_pattern/tokenizer.json"));
    std::ofstream(dir.str() + "/tokenizer.json") << source.rdbuf();
  }
  std::ofstream(dir.str() + "/tokenizer_config.json")
      << R"({"eos_token": {"content": "<|im_end|>"}, "chat_template": "{{ '<|im_start|>system\nBe brief.<|im_end|>\n' }}"})";
  const auto tokenizer = Tokenizer::from_hf_directory(dir.str());
  EXPECT_EQ(tokenizer->eos_token_ids().front(), *tokenizer->token_to_id("<|im_end|>"));
  EXPECT_EQ(tokenizer->chat_template().kind(), ChatTemplate::Kind::kChatML);
  EXPECT_EQ(tokenizer->chat_template().render({{"user", "hi"}}, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n");
}

TEST(TokenizerHfTest, ConcurrentEncodesAgree) {
  const auto tokenizer = load("qwen2_pattern");
  const nlohmann::json corpus = read_fixture("corpus.json");
  std::vector<std::vector<TokenId>> reference;
  for (const auto& text : corpus) reference.push_back(tokenizer->encode(text.get<std::string>()));
  std::vector<std::thread> threads;
  std::atomic<int> num_mismatches{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < 5; ++round)
        for (size_t i = 0; i < corpus.size(); ++i)
          if (tokenizer->encode(corpus[i].get<std::string>()) != reference[i]) ++num_mismatches;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(num_mismatches.load(), 0);
}

}  // namespace
}  // namespace loom
