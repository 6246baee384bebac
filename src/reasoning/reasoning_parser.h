// A reasoning model's thinking in its generated text (`--reasoning-parser`,
// vLLM's flag), split from the answer, whole or streamed:
//
//   qwen3        Qwen3: <think>reasoning</think>answer; the model writes <think>
//                itself, or the chat template puts it in the prompt.
//                chat_template_kwargs.enable_thinking false (the template then
//                closes an empty think block in the prompt) makes it all answer.
//   deepseek_r1  DeepSeek-R1: the same markers; its templates end the prompt with
//                <think>, so the output starts inside the reasoning.
//   none         no splitting: the text is content.
//
// As vLLM's parsers split: a <think> the output opens with (after whitespace)
// is dropped; the reasoning runs to the first </think>, the answer is what
// follows it; without </think> everything is reasoning (the output was cut, or
// never left its thinking), unless the output starts in the answer (the prompt
// already closed the think block, or qwen3 with thinking turned off).
//
// Streaming holds back only what may still be a marker (a prefix of <think>
// at the start, of </think> inside the reasoning); for any text and any way of
// cutting it into pieces the streamed deltas concatenate to the whole split.
// Pure text, no tokens; nothing here throws on any input. Not thread-safe; one
// splitter per choice.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace loom::reasoning {

enum class ReasoningKind { kNone, kQwen3, kDeepSeekR1 };

inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";

// "none", "qwen3", "deepseek_r1".
const char* reasoning_parser_name(ReasoningKind kind);
// The kind named by `name`, or nullopt for an unknown name.
std::optional<ReasoningKind> reasoning_parser_from_name(std::string_view name);

// Whether `kind`'s output for a prompt rendered as `prompt` starts in the
// answer: the prompt ends with a closed think block (whitespace after it
// ignored), or, for qwen3, `enable_thinking` is false.
bool starts_in_answer(ReasoningKind kind, std::string_view prompt, bool enable_thinking);

// One piece of split text; the whole output's split when returned by split_reasoning.
struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningSplitter {
 public:
  // kind kNone, or starting in the answer: everything is content.
  ReasoningSplitter(ReasoningKind kind, bool in_answer);

  // The next piece of generated text.
  ReasoningDelta feed(std::string_view text);
  // The output ended with `last_text`: what was held back is released.
  ReasoningDelta finish(std::string_view last_text = {});
  // Whether the reasoning ended (or never began): the text from here is the answer.
  bool in_answer() const { return state_ == State::kAnswer; }

 private:
  enum class State { kStart, kReasoning, kAnswer };
  ReasoningDelta run(bool at_end);

  State state_;
  std::string held_;  // fed, not released yet
};

// The whole output split at once (= a splitter fed `text`, then finished).
ReasoningDelta split_reasoning(ReasoningKind kind, bool in_answer, std::string_view text);

}  // namespace loom::reasoning
