// Chat templates as the tokenizer knows them: the sources a model ships
// (ModelChatTemplates, rendered by the chat module's Jinja-based ChatRenderer)
// and the built-in ChatML / Llama-3 templates for models that ship none (and
// for the synthetic tokenizers, which write ChatTemplate::jinja() into their
// tokenizer_config.json). ChatTemplate::render() is the native rendering of a
// built-in template; serving renders every template through the interpreter.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace loom {

struct ChatMessage {
  std::string role;     // "system" | "user" | "assistant" | "tool"
  std::string content;
};

// The chat templates and special-token strings a model ships, as transformers
// hands them to apply_chat_template. Immutable once the tokenizer is built.
struct ModelChatTemplates {
  // The "default" template (tokenizer_config.json `chat_template` as a string,
  // the entry named "default" of its list form, chat_template.jinja beside it,
  // or GGUF tokenizer.chat_template); for a model with none, the built-in
  // ChatML template's source (has_model_template false).
  std::string default_source;
  bool has_model_template = false;
  // The list form's entry named "tool_use" ("" = none): used when tools are given.
  std::string tool_use_source;
  // bos_token, eos_token, unk_token, pad_token as strings, where the config names them.
  std::vector<std::pair<std::string, std::string>> special_tokens;
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
