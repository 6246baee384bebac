// Chat prompts from the model's own Jinja chat template, as vLLM's OpenAI
// server builds them (transformers' apply_chat_template plus vLLM's message
// preparation). Used by the server's /v1/chat/completions and `loom generate`.
//
// What a template sees (the context transformers passes):
//   messages               the request's messages, every field the client sent, prepared as vLLM does
//                          (prepare_chat_messages below: content format, tool-call arguments as objects)
//   tools, documents       the request's lists as given, or none (null) when absent
//   add_generation_prompt  the request's flag
//   bos_token, eos_token,  strings from tokenizer_config.json (or the GGUF), where it names them
//   unk_token, pad_token
//   chat_template_kwargs   each entry a variable of its own (e.g. enable_thinking); they may
//                          override the special tokens, not messages/tools/documents/add_generation_prompt
// and the interpreter's globals (raise_exception, strftime_now, namespace, range, ...).
// continue_final_message is not a variable: as transformers does, the rendered
// text is cut after the final message's content, leaving that message open.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "template/jinja.h"
#include "tokenizer/chat_template.h"
#include "util/cache_gauge.h"

namespace loom {

// One chat rendering's inputs; JSON with the request's key order (tojson keeps it).
struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // [{role, content, ...}, ...]
  nlohmann::ordered_json tools;      // null = none, else a list (passed as given)
  nlohmann::ordered_json documents;  // null = none, else a list (passed as given)
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  bool add_generation_prompt = true;
  bool continue_final_message = false;
};

// How message content reaches the template (vLLM's chat-template content format).
//   kString: a string; a list of text parts joined with "\n"; null -> "".
//   kOpenAi: a list of parts; a string s -> [{"type": "text", "text": s}]; null -> [].
// A template that loops over a message's content gets kOpenAi, any other kString.
enum class ChatContentFormat { kString, kOpenAi };
ChatContentFormat detect_content_format(const std::string& template_source);

// vLLM's preparation of the messages for a template: content in `format`;
// each tool call's function.arguments, when a JSON string, parsed into its
// value ("" or null -> {}), since tool-use templates iterate or tojson them;
// role "developer" read as "system"; every other field kept as sent.
// Precondition: messages is a list of objects (the server validates the shape).
// Throws Error(kInvalidArgument) naming messages[i].tool_calls[j].function.arguments
// for arguments that are not JSON.
nlohmann::ordered_json prepare_chat_messages(const nlohmann::ordered_json& messages, ChatContentFormat format);

// A parsed chat template and the content format it wants. Immutable.
struct ParsedChatTemplate {
  explicit ParsedChatTemplate(std::string source);  // throws Error("template line N: ...")
  JinjaTemplate jinja;
  ChatContentFormat content_format;
};

// Renders chat prompts. Thread-safe: render() may run on many HTTP threads at
// once (the templates are immutable; the per-request cache is locked).
class ChatRenderer {
 public:
  // `model` is copied. A non-empty `override_source` (`--chat-template`)
  // replaces the model's templates. Parses every template now: throws
  // Error(kInvalidArgument, "chat template: template line N: ...") for one
  // that does not parse, so a bad template stops start-up.
  explicit ChatRenderer(const ModelChatTemplates& model, const std::string& override_source = {});

  // Renders with the model's template ("tool_use" when tools are given and the
  // model has one), or with `request_template_source` when it is non-empty (a
  // per-request `chat_template`, parsed once and kept among the most recently
  // used few). Throws Error(kInvalidArgument, "chat template: ...") for every
  // failure: a syntax or render error (naming the template line),
  // raise_exception, reserved chat_template_kwargs, both add_generation_prompt
  // and continue_final_message, a final message continue_final_message cannot
  // find in the rendered text.
  std::string render(const ChatRequest& request, const std::string& request_template_source = {}) const;

  // True when the model ships a template (or --chat-template gave one); false
  // when the built-in ChatML template stands in.
  bool has_model_template() const { return has_model_template_; }

  // The per-request templates parsed and kept ("chat_templates"): at most
  // kMaxCachedRequestTemplates, least recently used evicted; bytes count their sources.
  CacheGauge cache_gauge() const;

 private:
  std::shared_ptr<const ParsedChatTemplate> request_template(const std::string& source) const;

  std::shared_ptr<const ParsedChatTemplate> default_template_;
  std::shared_ptr<const ParsedChatTemplate> tool_use_template_;  // null = none
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
  bool has_model_template_ = false;

  static constexpr size_t kMaxCachedRequestTemplates = 8;
  mutable std::mutex cache_mutex_;
  mutable std::list<std::pair<std::string, std::shared_ptr<const ParsedChatTemplate>>> cache_;  // most recent first
  mutable int64_t evictions_ = 0;
};

// transformers' continue_final_message cut: `rendered` up to the end of the
// final message's text (the last text part of a list), so the model continues
// it. Throws Error(kInvalidArgument) when that text does not appear.
std::string cut_after_final_message(const std::string& rendered, const nlohmann::ordered_json& final_message);

}  // namespace loom

namespace loom {

// A `--chat-template` argument as vLLM reads it: the contents of the file it
// names when that exists; else the template text itself, with \n, \t, \r and
// \\ escapes decoded. Throws Error(kNotFound) for an argument that looks like
// a path (no '{', '}' or newline) but names no readable file.
std::string load_chat_template_argument(const std::string& argument);

}  // namespace loom
