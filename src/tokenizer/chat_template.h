// Built-in chat templates. We do not run Jinja: the template string from
// tokenizer_config.json / GGUF is recognised as ChatML or Llama-3 and rendered
// natively; anything else falls back to ChatML with a warning.
#pragma once

#include <string>
#include <vector>

namespace loom {

struct ChatMessage {
  std::string role;     // "system" | "user" | "assistant" | "tool"
  std::string content;
};

class ChatTemplate {
 public:
  enum class Kind { kChatML, kLlama3 };

  // Picks the kind from a Jinja template string (empty -> ChatML). For ChatML,
  // a default system prompt found in the template (as SmolLM2 has) is kept.
  static ChatTemplate from_jinja(const std::string& jinja_template, const std::string& bos_token = {});
  static ChatTemplate chatml(std::string default_system_prompt = {});
  static ChatTemplate llama3(std::string bos_token = "<|begin_of_text|>");

  Kind kind() const { return kind_; }
  // Renders messages; add_generation_prompt appends the assistant header.
  // Throws Error(kInvalidArgument) for an empty list.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;
  // The Jinja source to write into tokenizer_config.json.
  const std::string& jinja() const { return jinja_; }

 private:
  Kind kind_ = Kind::kChatML;
  std::string default_system_prompt_;
  std::string bos_token_;
  std::string jinja_;
};

}  // namespace loom
