#include "reasoning/reasoning_detection.h"

namespace loom::reasoning {
namespace {

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view trim_end(std::string_view text) {
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

}  // namespace

ReasoningDetection detect_reasoning_parser(std::string_view template_source, std::string_view generation_prompt,
                                           bool has_think_tokens) {
  const bool marks_thinking = template_source.find(kThinkEnd) != std::string_view::npos;
  if (!marks_thinking) return {ReasoningKind::kNone, "the chat template has no </think>"};
  if (!has_think_tokens) return {ReasoningKind::kNone, "the vocabulary has no <think> and </think> tokens"};
  if (trim_end(generation_prompt).ends_with(kThinkStart))
    return {ReasoningKind::kDeepSeekR1, "the chat template's generation prompt opens a think block"};
  if (template_source.find("enable_thinking") != std::string_view::npos &&
      template_source.find(kThinkStart) != std::string_view::npos)
    return {ReasoningKind::kQwen3, "the chat template writes think blocks and has the enable_thinking switch"};
  return {ReasoningKind::kNone,
          "the chat template neither opens a think block in the generation prompt nor has enable_thinking"};
}

}  // namespace loom::reasoning
