// --reasoning-parser auto: the parser picked from the chat template (the
// fixtures of real families' templates, rendered) and the vocabulary's think
// tokens; an explicit name wins, an unknown one is refused.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "chat/chat_renderer.h"
#include "reasoning/reasoning_detection.h"
#include "server/reasoning_choice.h"
#include "server_tokenizer_fixture.h"
#include "test_util.h"
#include "util/error.h"

namespace loom::server {
namespace {

using reasoning::ReasoningKind;

std::string fixture_template(const std::string& name) {
  std::ifstream file(test::fixture_path("chat/" + name), std::ios::binary);
  EXPECT_TRUE(file.good()) << name;
  std::stringstream buffer;
  buffer << file.rdbuf();
  return buffer.str();
}

ReasoningKind pick(const std::string& source, bool think_tokens, const std::string& flag = "auto") {
  ModelChatTemplates model;
  model.default_source = source;
  model.has_model_template = true;
  const ChatRenderer renderer(model);
  const auto tokenizer = test::make_server_test_tokenizer(think_tokens);
  return resolve_reasoning_parser(flag, source, renderer, *tokenizer).kind;
}

TEST(ReasoningDetection, FamiliesTemplatesWithThinkTokens) {
  // The generation prompt opens the think block: the output starts in the reasoning.
  EXPECT_EQ(pick(fixture_template("deepseek_r1.jinja"), true), ReasoningKind::kDeepSeekR1);
  // enable_thinking and think blocks: the model opens <think> itself.
  EXPECT_EQ(pick(fixture_template("qwen3.jinja"), true), ReasoningKind::kQwen3);
  EXPECT_EQ(pick(fixture_template("smollm3.jinja"), true), ReasoningKind::kQwen3);
  // Granite thinks in its own words, the others not at all.
  for (const char* name : {"granite.jinja", "llama32.jinja", "smollm2.jinja", "mistral_v7_tekken.jinja", "phi4_mini.jinja"})
    EXPECT_EQ(pick(fixture_template(name), true), ReasoningKind::kNone) << name;
}

TEST(ReasoningDetection, NoThinkTokensNoParser) {
  // A random-vocabulary model served with a thinking template never writes a think block on purpose.
  EXPECT_EQ(pick(fixture_template("deepseek_r1.jinja"), false), ReasoningKind::kNone);
  EXPECT_EQ(pick(fixture_template("qwen3.jinja"), false), ReasoningKind::kNone);
}

TEST(ReasoningDetection, TemplateThatOnlyStripsEarlierThinkingIsNone) {
  // Qwen3-Instruct-2507's kind: earlier turns' </think> cut away, no switch, no open block.
  const std::string instruct =
      "{% for m in messages %}<|im_start|>{{ m.role }}\n"
      "{% if '</think>' in m.content %}{{ m.content.split('</think>')[-1] }}{% else %}{{ m.content }}{% endif %}"
      "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  EXPECT_EQ(pick(instruct, true), ReasoningKind::kNone);
  // The same with a prompt that opens the block (Qwen3-Thinking-2507): deepseek_r1.
  const std::string thinking =
      instruct.substr(0, instruct.size() - std::string("{% endif %}").size()) + "<think>\n{% endif %}";
  EXPECT_EQ(pick(thinking, true), ReasoningKind::kDeepSeekR1);
}

TEST(ReasoningDetection, ExplicitNamesWinAndUnknownIsRefused) {
  const std::string qwen3 = fixture_template("qwen3.jinja");
  EXPECT_EQ(pick(qwen3, true, "none"), ReasoningKind::kNone);
  EXPECT_EQ(pick(qwen3, false, "deepseek_r1"), ReasoningKind::kDeepSeekR1);
  EXPECT_EQ(pick(fixture_template("llama32.jinja"), false, "qwen3"), ReasoningKind::kQwen3);
  EXPECT_THROW(pick(qwen3, true, "granite"), Error);
}

TEST(ReasoningDetection, PureFunctionReasons) {
  using reasoning::detect_reasoning_parser;
  EXPECT_EQ(detect_reasoning_parser("no markers", "<think>\n", true).kind, ReasoningKind::kNone);
  EXPECT_EQ(detect_reasoning_parser("</think>", "Assistant:<think>\n\n", true).kind, ReasoningKind::kDeepSeekR1);
  EXPECT_EQ(detect_reasoning_parser("</think>", "", true).kind, ReasoningKind::kNone);  // no prompt rendered
  EXPECT_EQ(detect_reasoning_parser("enable_thinking <think></think>", "", true).kind, ReasoningKind::kQwen3);
  EXPECT_EQ(detect_reasoning_parser("enable_thinking <think></think>", "", false).kind, ReasoningKind::kNone);
  EXPECT_FALSE(detect_reasoning_parser("enable_thinking <think></think>", "", false).reason.empty());
}

}  // namespace
}  // namespace loom::server
