// IncrementalDetokenizer: streamed text never splits a UTF-8 character, and the
// concatenation of everything pushed equals decode() of all ids.
#include <gtest/gtest.h>

#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace loom {
namespace {

std::shared_ptr<const Tokenizer> load(const std::string& name) {
  return Tokenizer::from_hf_json_file(test::fixture_path("tokenizer/" + name + "/tokenizer.json"));
}

// Pushes ids one by one; every chunk must be valid UTF-8.
std::string stream(const std::shared_ptr<const Tokenizer>& tokenizer, const std::vector<TokenId>& ids,
                   bool skip_special_tokens, int* num_split_tokens = nullptr) {
  IncrementalDetokenizer detokenizer(tokenizer, skip_special_tokens);
  std::string text;
  for (TokenId id : ids) {
    const std::string chunk = detokenizer.push(id);
    EXPECT_TRUE(utf8::is_valid(chunk)) << "chunk for id " << id;
    if (num_split_tokens != nullptr && !utf8::is_valid(tokenizer->token_bytes(id))) ++*num_split_tokens;
    text += chunk;
  }
  return text + detokenizer.flush();
}

TEST(IncrementalDetokenizerTest, EmojiAndCjkSplitAcrossByteTokens) {
  const auto tokenizer = load("llama3_pattern");
  const std::string text = "emoji 😀 🎉 👨‍👩‍👧‍👦 and 日本語のテキスト 中文 한국어";
  const auto ids = tokenizer->encode(text, false);
  int num_split_tokens = 0;
  EXPECT_EQ(stream(tokenizer, ids, true, &num_split_tokens), text);
  // The tiny vocabulary has no whole-emoji tokens: characters really are split.
  EXPECT_GT(num_split_tokens, 0);
}

TEST(IncrementalDetokenizerTest, HoldsBackIncompleteCharacterUntilItCompletes) {
  const auto tokenizer = load("llama3_pattern");
  const auto ids = tokenizer->encode("😀", false);
  ASSERT_GE(ids.size(), 2u);
  IncrementalDetokenizer detokenizer(tokenizer);
  for (size_t i = 0; i + 1 < ids.size(); ++i) EXPECT_EQ(detokenizer.push(ids[i]), "");
  EXPECT_EQ(detokenizer.push(ids.back()), "😀");
  EXPECT_EQ(detokenizer.flush(), "");
}

TEST(IncrementalDetokenizerTest, FlushReplacesDanglingBytes) {
  const auto tokenizer = load("llama3_pattern");
  const auto ids = tokenizer->encode("😀", false);
  IncrementalDetokenizer detokenizer(tokenizer);
  EXPECT_EQ(detokenizer.push(ids[0]), "");
  EXPECT_EQ(detokenizer.flush(), "\xEF\xBF\xBD");
}

TEST(IncrementalDetokenizerTest, MatchesDecodeOnCorpusAndSkipsSpecialTokens) {
  for (const char* name : {"llama3_pattern", "qwen2_pattern", "byte_fallback"}) {
    SCOPED_TRACE(name);
    const auto tokenizer = load(name);
    for (const std::string text : {"Hello <|im_end|>world 😀", "naïve café 日本語", "def f(x):\n\treturn x  # ✓"}) {
      const auto ids = tokenizer->encode(text, true);
      if (std::string(name) != "byte_fallback") {
        EXPECT_EQ(stream(tokenizer, ids, true), tokenizer->decode(ids, true));
        EXPECT_EQ(stream(tokenizer, ids, false), tokenizer->decode(ids, false));
      } else {
        // Llama-2 style decoders strip the first space; streaming keeps token bytes.
        EXPECT_EQ(stream(tokenizer, ids, true), " " + tokenizer->decode(ids, true));
      }
    }
  }
}

}  // namespace
}  // namespace loom
