// Native chat templates against transformers' apply_chat_template output
// (tests/fixtures/tokenizer/chat_templates.json, from make_fixtures.py).
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "tokenizer/chat_template.h"
#include "util/error.h"

namespace loom {
namespace {

nlohmann::json fixture() {
  std::ifstream file(test::fixture_path("tokenizer/chat_templates.json"));
  std::stringstream buffer;
  buffer << file.rdbuf();
  return nlohmann::json::parse(buffer.str());
}

void expect_renders_like_transformers(const ChatTemplate& chat_template, const nlohmann::json& spec) {
  for (const auto& c : spec.at("cases")) {
    std::vector<ChatMessage> messages;
    for (const auto& m : c["messages"]) messages.push_back({m["role"], m["content"]});
    EXPECT_EQ(chat_template.render(messages, c["add_generation_prompt"].get<bool>()), c["expected"].get<std::string>())
        << c["messages"].dump();
  }
}

TEST(ChatTemplateTest, SmolLM2TemplateKeepsDefaultSystemPrompt) {
  const auto spec = fixture().at("smollm2");
  const ChatTemplate chat_template = ChatTemplate::from_jinja(spec["template"]);
  EXPECT_EQ(chat_template.kind(), ChatTemplate::Kind::kChatML);
  EXPECT_EQ(chat_template.jinja(), spec["template"].get<std::string>());
  expect_renders_like_transformers(chat_template, spec);
  // Generating the template back gives SmolLM2's exact Jinja source.
  EXPECT_EQ(ChatTemplate::chatml("You are a helpful AI assistant named SmolLM, trained by Hugging Face").jinja(),
            spec["template"].get<std::string>());
}

TEST(ChatTemplateTest, PlainChatML) {
  const auto spec = fixture().at("chatml");
  EXPECT_EQ(ChatTemplate::chatml().jinja(), spec["template"].get<std::string>());
  expect_renders_like_transformers(ChatTemplate::from_jinja(spec["template"]), spec);
  expect_renders_like_transformers(ChatTemplate::from_jinja(""), spec);
}

TEST(ChatTemplateTest, Llama3TrimsContentAndPrependsBos) {
  const auto spec = fixture().at("llama3");
  EXPECT_EQ(ChatTemplate::llama3().jinja(), spec["template"].get<std::string>());
  const ChatTemplate chat_template = ChatTemplate::from_jinja(spec["template"], "<|begin_of_text|>");
  EXPECT_EQ(chat_template.kind(), ChatTemplate::Kind::kLlama3);
  expect_renders_like_transformers(chat_template, spec);
}

TEST(ChatTemplateTest, EscapedNewlinesInDefaultSystemPrompt) {
  // Qwen2 style: the newline is a "\n" escape inside the Jinja string.
  const std::string jinja =
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
      "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
  EXPECT_EQ(ChatTemplate::from_jinja(jinja).render({{"user", "hi"}}, true),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, UnknownTemplateFallsBackToChatML) {
  const ChatTemplate chat_template = ChatTemplate::from_jinja("{{ messages[0]['content'] }} [INST]");
  EXPECT_EQ(chat_template.kind(), ChatTemplate::Kind::kChatML);
  EXPECT_EQ(chat_template.render({{"user", "x"}}, false), "<|im_start|>user\nx<|im_end|>\n");
}

TEST(ChatTemplateTest, EmptyMessageListIsInvalid) {
  try {
    ChatTemplate::chatml().render({});
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kInvalidArgument);
  }
}

}  // namespace
}  // namespace loom
