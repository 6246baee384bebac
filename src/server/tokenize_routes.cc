#include "server/tokenize_routes.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/chat_request.h"
#include "server/json_input.h"
#include "server/json_output.h"

namespace loom::server {
namespace {

using Json = nlohmann::json;

void check_model(const Json& body, const ParseContext& context) {
  const auto it = body.find("model");
  if (it == body.end() || it->is_null()) return;
  if (!it->is_string()) throw_bad_request("model", "'model' must be a string");
  resolve_adapter(it->get<std::string>(), context);
}

}  // namespace

std::string tokenize_body(const ParseContext& context, std::string_view body_text) {
  const Json body = parse_json_object_body(body_text);
  check_model(body, context);
  const Tokenizer& tokenizer = *context.tokenizer;
  std::vector<TokenId> tokens;
  if (body.contains("messages")) {
    if (body.contains("prompt")) throw_bad_request("prompt", "give either 'prompt' or 'messages', not both");
    // Chat prompts carry the template's own special tokens; add_special_tokens adds what encode() would (BOS).
    if (read_bool(body, "add_special_tokens", false)) tokens = tokenizer.encode("", true);
    if (!context.chat_renderer) throw ApiError(500, "no chat renderer", "server_error");
    const ChatPrompt chat = read_chat_prompt(body_text, tokenizer, *context.chat_renderer);
    tokens.insert(tokens.end(), chat.tokens.begin(), chat.tokens.end());
  } else {
    const auto prompt = body.find("prompt");
    if (prompt == body.end() || !prompt->is_string())
      throw_bad_request("prompt", "'prompt' (a string) or 'messages' (a chat) is required");
    tokens = tokenizer.encode(prompt->get<std::string>(), read_bool(body, "add_special_tokens", true));
  }
  Json token_strs = nullptr;
  if (read_bool(body, "return_token_strs", false)) {
    token_strs = Json::array();
    for (TokenId id : tokens) token_strs.push_back(tokenizer.token_text(id));
  }
  return dump_json(Json{{"count", tokens.size()},
                        {"max_model_len", context.max_context_tokens},
                        {"tokens", tokens},
                        {"token_strs", token_strs}});
}

std::string detokenize_body(const ParseContext& context, std::string_view body_text) {
  const Json body = parse_json_object_body(body_text);
  check_model(body, context);
  const auto list = body.find("tokens");
  if (list == body.end() || !list->is_array()) throw_bad_request("tokens", "'tokens' (a list of token ids) is required");
  const std::vector<TokenId> tokens = read_token_ids(*list, "tokens", context.tokenizer->vocab_size());
  return dump_json(Json{{"prompt", context.tokenizer->decode(tokens)}});
}

}  // namespace loom::server
