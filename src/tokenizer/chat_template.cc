#include "tokenizer/chat_template.h"

#include "util/error.h"

namespace loom {
namespace {

// SmolLM2's and Qwen2's template shape: an optional default system turn, then
// ChatML turns. Literal newlines inside the strings, as SmolLM2 ships it.
std::string chatml_jinja(const std::string& default_system_prompt) {
  std::string jinja = "{% for message in messages %}";
  if (!default_system_prompt.empty()) {
    jinja += "{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n" +
             default_system_prompt + "<|im_end|>\n' }}{% endif %}";
  }
  jinja +=
      "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
  return jinja;
}

// Meta-Llama-3-8B-Instruct's template.
constexpr const char* kLlama3Jinja =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

// Undoes Jinja string-literal escapes (\n, \t, \', \", \\).
std::string unescape_jinja(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\' || i + 1 == text.size()) {
      out.push_back(text[i]);
      continue;
    }
    const char next = text[++i];
    switch (next) {
      case 'n': out.push_back('\n'); break;
      case 't': out.push_back('\t'); break;
      case 'r': out.push_back('\r'); break;
      default: out.push_back(next); break;
    }
  }
  return out;
}

// The system prompt a ChatML template inserts when the first message is not a
// system message: the text between "<|im_start|>system\n" and "<|im_end|>"
// inside a string literal (SmolLM2, Qwen2).
std::string find_default_system_prompt(const std::string& jinja) {
  for (const std::string header : {"<|im_start|>system\n", "<|im_start|>system\\n"}) {
    for (size_t begin = jinja.find(header); begin != std::string::npos; begin = jinja.find(header, begin + 1)) {
      const size_t text_begin = begin + header.size();
      const size_t end = jinja.find("<|im_end|>", text_begin);
      if (end == std::string::npos) break;
      const std::string literal = jinja.substr(text_begin, end - text_begin);
      // A template that renders a variable here (message['content']) has no default.
      if (literal.empty() || literal.find_first_of("{}'\"+") != std::string::npos) continue;
      return unescape_jinja(literal);
    }
  }
  return {};
}

// Python's str.strip() for the whitespace a chat message can carry.
std::string trim(const std::string& text) {
  const auto is_space = [](unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  size_t begin = 0, end = text.size();
  while (begin < end && is_space(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && is_space(static_cast<unsigned char>(text[end - 1]))) --end;
  return text.substr(begin, end - begin);
}

}  // namespace

ChatTemplate ChatTemplate::from_jinja(const std::string& jinja_template, const std::string& bos_token) {
  if (jinja_template.find("<|start_header_id|>") != std::string::npos) {
    ChatTemplate result = llama3(bos_token.empty() ? "<|begin_of_text|>" : bos_token);
    result.jinja_ = jinja_template;
    return result;
  }
  if (jinja_template.empty()) return chatml();
  if (jinja_template.find("<|im_start|>") == std::string::npos) {
    ChatTemplate result = chatml();  // the native fallback; serving renders jinja() itself
    result.jinja_ = jinja_template;
    return result;
  }
  ChatTemplate result = chatml(find_default_system_prompt(jinja_template));
  result.jinja_ = jinja_template;
  return result;
}

ChatTemplate ChatTemplate::chatml(std::string default_system_prompt) {
  ChatTemplate result;
  result.kind_ = Kind::kChatML;
  result.jinja_ = chatml_jinja(default_system_prompt);
  result.default_system_prompt_ = std::move(default_system_prompt);
  return result;
}

ChatTemplate ChatTemplate::llama3(std::string bos_token) {
  ChatTemplate result;
  result.kind_ = Kind::kLlama3;
  result.bos_token_ = std::move(bos_token);
  result.jinja_ = kLlama3Jinja;
  return result;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  if (messages.empty()) fail(ErrorKind::kInvalidArgument, "chat template: the message list is empty");
  std::string out;
  if (kind_ == Kind::kLlama3) {
    out += bos_token_;
    for (const ChatMessage& message : messages) {
      out += "<|start_header_id|>" + message.role + "<|end_header_id|>\n\n" + trim(message.content) + "<|eot_id|>";
    }
    if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
    return out;
  }
  if (!default_system_prompt_.empty() && messages.front().role != "system") {
    out += "<|im_start|>system\n" + default_system_prompt_ + "<|im_end|>\n";
  }
  for (const ChatMessage& message : messages) {
    out += "<|im_start|>" + message.role + "\n" + message.content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace loom
