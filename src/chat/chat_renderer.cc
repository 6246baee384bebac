#include "chat/chat_renderer.h"

#include <algorithm>
#include <cctype>
#include <string_view>

#include <fmt/format.h>

#include "util/error.h"

namespace loom {
namespace {

using OrderedJson = nlohmann::ordered_json;

// Names the template gets from the request itself; kwargs may not replace them
// (transformers would fail with "got multiple values for keyword argument").
constexpr const char* kReservedVariables[] = {"messages", "tools", "documents", "add_generation_prompt"};

// Python's str.strip() for ASCII whitespace.
std::string_view strip(std::string_view text) {
  const auto is_space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

std::string_view lstrip(std::string_view text) {
  const auto is_space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  return text;
}

[[noreturn]] void fail_chat(const std::string& message) {
  throw Error(ErrorKind::kInvalidArgument, "chat template: " + message);
}

OrderedJson prepare_content(const OrderedJson* content, ChatContentFormat format) {
  if (format == ChatContentFormat::kOpenAi) {
    if (content == nullptr || content->is_null()) return OrderedJson::array();
    if (content->is_string()) return OrderedJson::array({{{"type", "text"}, {"text", *content}}});
    return *content;
  }
  if (content == nullptr || content->is_null()) return "";
  if (!content->is_array()) return *content;
  std::string text;
  bool first = true;
  for (const OrderedJson& part : *content) {
    if (!part.is_object()) continue;
    const auto it = part.find("text");
    if (it == part.end() || !it->is_string()) continue;
    if (!first) text += '\n';
    text += it->get_ref<const std::string&>();
    first = false;
  }
  return text;
}

void parse_tool_call_arguments(OrderedJson& message, size_t message_index) {
  const auto calls = message.find("tool_calls");
  if (calls == message.end() || !calls->is_array()) return;
  for (size_t j = 0; j < calls->size(); ++j) {
    OrderedJson& call = (*calls)[j];
    if (!call.is_object()) continue;
    const auto function = call.find("function");
    if (function == call.end() || !function->is_object()) continue;
    const auto arguments = function->find("arguments");
    if (arguments == function->end() || arguments->is_null() ||
        (arguments->is_string() && arguments->get_ref<const std::string&>().empty())) {
      (*function)["arguments"] = OrderedJson::object();
      continue;
    }
    if (!arguments->is_string()) continue;
    try {
      *arguments = OrderedJson::parse(arguments->get_ref<const std::string&>());
    } catch (const nlohmann::json::exception&) {
      throw Error(ErrorKind::kInvalidArgument,
                  fmt::format("messages[{}].tool_calls[{}].function.arguments is not valid JSON", message_index, j),
                  "send the arguments as a JSON object, or a string holding one");
    }
  }
}

}  // namespace

ChatContentFormat detect_content_format(const std::string& template_source) {
  // vLLM walks the template's AST for a loop over message content; this looks
  // for the same loop in the source: `for part in message['content']` or
  // `... in message.content`. A linear scan (std::regex recurses per character
  // and a per-request template may be megabytes).
  const std::string_view source = template_source;
  const auto is_word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  const auto is_space = [](char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  for (size_t at = source.find("for"); at != std::string_view::npos; at = source.find("for", at + 1)) {
    if ((at > 0 && is_word(source[at - 1])) || at + 3 >= source.size() || !is_space(source[at + 3])) continue;
    // The loop's targets and iterable name: a run of word characters, spaces, commas and parentheses.
    // Bounded: real loop heads are short, and a long run must not make this quadratic.
    size_t run_end = at + 3;
    const size_t run_limit = std::min(source.size(), at + 3 + 256);
    while (run_end < run_limit &&
           (is_word(source[run_end]) || is_space(source[run_end]) || std::string_view(",()").find(source[run_end]) !=
                                                                          std::string_view::npos))
      ++run_end;
    const std::string_view run = source.substr(at + 3, run_end - at - 3);
    size_t in = std::string_view::npos;
    for (size_t i = 1; i + 2 < run.size(); ++i)
      if (is_space(run[i - 1]) && run[i] == 'i' && run[i + 1] == 'n' && is_space(run[i + 2])) {
        in = i;
        break;
      }
    if (in == std::string_view::npos) continue;
    std::string_view iterable = strip(run.substr(in + 2));
    if (iterable.empty() || !std::all_of(iterable.begin(), iterable.end(), is_word)) continue;
    std::string_view rest = source.substr(run_end);
    if (rest.rfind(".content", 0) == 0 && (rest.size() == 8 || !is_word(rest[8]))) return ChatContentFormat::kOpenAi;
    if (rest.empty() || rest.front() != '[') continue;
    rest = lstrip(rest.substr(1));
    if (rest.rfind("'content'", 0) != 0 && rest.rfind("\"content\"", 0) != 0) continue;
    rest = lstrip(rest.substr(9));
    if (!rest.empty() && rest.front() == ']') return ChatContentFormat::kOpenAi;
  }
  return ChatContentFormat::kString;
}

OrderedJson prepare_chat_messages(const OrderedJson& messages, ChatContentFormat format) {
  OrderedJson prepared = OrderedJson::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    OrderedJson message = messages[i];
    LOOM_CHECK(message.is_object());
    const auto content = message.find("content");
    message["content"] = prepare_content(content == message.end() ? nullptr : &*content, format);
    if (const auto role = message.find("role"); role != message.end() && *role == "developer") *role = "system";
    parse_tool_call_arguments(message, i);
    prepared.push_back(std::move(message));
  }
  return prepared;
}

ParsedChatTemplate::ParsedChatTemplate(std::string source)
    : jinja(source), content_format(detect_content_format(source)) {}

ChatRenderer::ChatRenderer(const ModelChatTemplates& model, const std::string& override_source) {
  const auto parse = [](const std::string& source, const char* what) {
    try {
      return std::make_shared<const ParsedChatTemplate>(source);
    } catch (const Error& error) {
      throw Error(ErrorKind::kInvalidArgument, fmt::format("{} chat template: {}", what, error.message()));
    }
  };
  if (!override_source.empty()) {
    default_template_ = parse(override_source, "--chat-template");
    has_model_template_ = true;
  } else {
    default_template_ = parse(model.default_source, "the model's");
    if (!model.tool_use_source.empty()) tool_use_template_ = parse(model.tool_use_source, "the model's tool_use");
    has_model_template_ = model.has_model_template;
  }
  for (const auto& [name, text] : model.special_tokens) special_tokens_[name] = text;
}

std::shared_ptr<const ParsedChatTemplate> ChatRenderer::request_template(const std::string& source) const {
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (it->first != source) continue;
      cache_.splice(cache_.begin(), cache_, it);
      return cache_.front().second;
    }
  }
  auto parsed = std::make_shared<const ParsedChatTemplate>(source);  // outside the lock: parsing takes a while
  std::lock_guard<std::mutex> lock(cache_mutex_);
  cache_.emplace_front(source, parsed);
  if (cache_.size() > kMaxCachedRequestTemplates) {
    cache_.pop_back();
    ++evictions_;
  }
  return parsed;
}

CacheGauge ChatRenderer::cache_gauge() const {
  std::lock_guard<std::mutex> lock(cache_mutex_);
  int64_t bytes = 0;
  for (const auto& [source, parsed] : cache_) bytes += static_cast<int64_t>(source.size());
  return {"chat_templates", static_cast<int64_t>(cache_.size()), static_cast<int64_t>(kMaxCachedRequestTemplates),
          bytes, evictions_};
}

std::string ChatRenderer::render(const ChatRequest& request, const std::string& request_template_source) const {
  if (request.add_generation_prompt && request.continue_final_message)
    fail_chat("add_generation_prompt and continue_final_message cannot both be true");
  const bool has_tools = request.tools.is_array() && !request.tools.empty();
  try {
    std::shared_ptr<const ParsedChatTemplate> chat_template =
        !request_template_source.empty() ? request_template(request_template_source)
        : has_tools && tool_use_template_ ? tool_use_template_
                                          : default_template_;
    OrderedJson context = special_tokens_;
    if (!request.template_kwargs.is_null()) {
      LOOM_CHECK(request.template_kwargs.is_object());
      for (const auto& [name, value] : request.template_kwargs.items()) {
        for (const char* reserved : kReservedVariables)
          if (name == reserved)
            fail_chat(fmt::format("chat_template_kwargs may not set '{}' (it comes from the request itself)", name));
        context[name] = value;
      }
    }
    context["messages"] = prepare_chat_messages(request.messages, chat_template->content_format);
    context["tools"] = request.tools;
    context["documents"] = request.documents;
    context["add_generation_prompt"] = request.add_generation_prompt;
    std::string rendered = chat_template->jinja.render(context);
    if (request.continue_final_message && !context["messages"].empty())
      rendered = cut_after_final_message(rendered, context["messages"].back());
    return rendered;
  } catch (const Error& error) {
    const std::string& message = error.message();
    if (message.rfind("chat template", 0) == 0 || message.rfind("messages[", 0) == 0) throw;
    fail_chat(message);
  }
}

std::string cut_after_final_message(const std::string& rendered, const OrderedJson& final_message) {
  const auto content = final_message.find("content");
  std::string text;
  if (content != final_message.end() && content->is_string()) {
    text = content->get<std::string>();
  } else if (content != final_message.end() && content->is_array()) {
    bool found = false;
    for (auto it = content->rbegin(); it != content->rend() && !found; ++it) {
      if (!it->is_object()) continue;
      const auto part_text = it->find("text");
      if (part_text != it->end() && part_text->is_string()) {
        text = part_text->get<std::string>();
        found = true;
      }
    }
    if (!found) fail_chat("continue_final_message: the final message has no text to continue");
  }
  const std::string_view stripped = strip(text);
  const size_t location = rendered.rfind(stripped);
  if (location == std::string::npos)
    fail_chat("continue_final_message: the final message does not appear in the rendered prompt (the template "
              "changes it)");
  const size_t lstripped_size = lstrip(text).size();
  if (rendered.compare(location, lstripped_size, text) == 0) return rendered.substr(0, location + lstripped_size);
  return rendered.substr(0, location + stripped.size());
}

}  // namespace loom
