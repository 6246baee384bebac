#include "reasoning/reasoning_parser.h"

#include <algorithm>

namespace loom::reasoning {
namespace {

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// The length of the longest suffix of `text` that is a proper prefix of `marker`.
size_t marker_prefix_at_end(std::string_view text, std::string_view marker) {
  for (size_t length = std::min(text.size(), marker.size() - 1); length > 0; --length)
    if (text.substr(text.size() - length) == marker.substr(0, length)) return length;
  return 0;
}

}  // namespace

const char* reasoning_parser_name(ReasoningKind kind) {
  switch (kind) {
    case ReasoningKind::kQwen3:
      return "qwen3";
    case ReasoningKind::kDeepSeekR1:
      return "deepseek_r1";
    case ReasoningKind::kNone:
      break;
  }
  return "none";
}

std::optional<ReasoningKind> reasoning_parser_from_name(std::string_view name) {
  for (ReasoningKind kind : {ReasoningKind::kNone, ReasoningKind::kQwen3, ReasoningKind::kDeepSeekR1})
    if (name == reasoning_parser_name(kind)) return kind;
  return std::nullopt;
}

bool starts_in_answer(ReasoningKind kind, std::string_view prompt, bool enable_thinking) {
  if (kind == ReasoningKind::kNone) return true;
  if (kind == ReasoningKind::kQwen3 && !enable_thinking) return true;
  while (!prompt.empty() && is_space(prompt.back())) prompt.remove_suffix(1);
  return prompt.ends_with(kThinkEnd);
}

ReasoningSplitter::ReasoningSplitter(ReasoningKind kind, bool in_answer)
    : state_(kind == ReasoningKind::kNone || in_answer ? State::kAnswer : State::kStart) {}

ReasoningDelta ReasoningSplitter::feed(std::string_view text) {
  held_.append(text);
  return run(false);
}

ReasoningDelta ReasoningSplitter::finish(std::string_view last_text) {
  held_.append(last_text);
  return run(true);
}

ReasoningDelta ReasoningSplitter::run(bool at_end) {
  ReasoningDelta out;
  if (state_ == State::kStart) {
    const size_t first = static_cast<size_t>(std::find_if_not(held_.begin(), held_.end(), is_space) - held_.begin());
    const std::string_view rest = std::string_view(held_).substr(first);
    if (rest.starts_with(kThinkStart)) {
      held_.erase(0, first + kThinkStart.size());
      state_ = State::kReasoning;
    } else if (!at_end && kThinkStart.starts_with(rest)) {
      return out;  // whitespace, or the start of <think>: wait
    } else {
      state_ = State::kReasoning;  // the prompt opened the think block
    }
  }
  if (state_ == State::kReasoning) {
    const size_t end = held_.find(kThinkEnd);
    if (end != std::string::npos) {
      out.reasoning = held_.substr(0, end);
      held_.erase(0, end + kThinkEnd.size());
      state_ = State::kAnswer;
    } else {
      const size_t keep = at_end ? 0 : marker_prefix_at_end(held_, kThinkEnd);
      out.reasoning = held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return out;
    }
  }
  out.content = std::move(held_);
  held_.clear();
  return out;
}

ReasoningDelta split_reasoning(ReasoningKind kind, bool in_answer, std::string_view text) {
  return ReasoningSplitter(kind, in_answer).finish(text);
}

}  // namespace loom::reasoning
