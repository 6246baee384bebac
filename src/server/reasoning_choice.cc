#include "server/reasoning_choice.h"

#include <string>

#include "util/error.h"

namespace loom::server {

reasoning::ReasoningDetection resolve_reasoning_parser(std::string_view name, std::string_view template_source,
                                                       const ChatRenderer& renderer, const Tokenizer& tokenizer) {
  if (name != "auto") {
    if (const auto kind = reasoning::reasoning_parser_from_name(name)) return {*kind, "--reasoning-parser"};
    fail(ErrorKind::kInvalidArgument, "unknown --reasoning-parser '{}' (auto, none, qwen3, deepseek_r1)", name);
  }
  std::string prompt;
  try {
    ChatRequest probe;
    probe.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "Hello"}}});
    prompt = renderer.render(probe);
  } catch (const Error&) {
    // A template that needs more than one user message: its source alone decides.
  }
  const bool has_think_tokens = tokenizer.token_to_id(reasoning::kThinkStart).has_value() &&
                                tokenizer.token_to_id(reasoning::kThinkEnd).has_value();
  return reasoning::detect_reasoning_parser(template_source, prompt, has_think_tokens);
}

}  // namespace loom::server
