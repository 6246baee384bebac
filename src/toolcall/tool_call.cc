#include "toolcall/tool_call.h"

namespace loom::toolcall {

const char* parser_name(ParserKind kind) {
  switch (kind) {
    case ParserKind::kNone: return "none";
    case ParserKind::kHermes: return "hermes";
    case ParserKind::kLlama3Json: return "llama3_json";
    case ParserKind::kMistral: return "mistral";
  }
  return "none";
}

std::optional<ParserKind> parser_from_name(std::string_view name) {
  for (const ParserKind kind : {ParserKind::kNone, ParserKind::kHermes, ParserKind::kLlama3Json, ParserKind::kMistral})
    if (name == parser_name(kind)) return kind;
  return std::nullopt;
}

ParserKind detect_parser(std::string_view chat_template_source) {
  const auto contains = [&](std::string_view marker) { return chat_template_source.find(marker) != std::string_view::npos; };
  // Order matters: a Hermes-style Llama fine-tune has both <tool_call> and the Llama-3 header.
  if (contains("<tool_call>")) return ParserKind::kHermes;
  if (contains("[TOOL_CALLS]")) return ParserKind::kMistral;
  if (contains("<|python_tag|>") || contains("<|start_header_id|>")) return ParserKind::kLlama3Json;
  return ParserKind::kNone;
}

std::string CallIdGenerator::next() {
  static constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id = mistral_ ? "" : "call_";
  const int length = mistral_ ? 9 : 24;
  for (int i = 0; i < length; ++i) id.push_back(kAlphabet[prng_.next_below(kAlphabet.size())]);
  return id;
}

ParsedOutput assemble_output(StreamDelta delta) {
  ParsedOutput output;
  output.content = std::move(delta.content);
  for (ToolCallDelta& piece : delta.tool_calls) {
    if (piece.is_first()) output.tool_calls.push_back({std::move(piece.id), std::move(piece.name), ""});
    else output.tool_calls.back().arguments += piece.arguments;
  }
  return output;
}

}  // namespace loom::toolcall
