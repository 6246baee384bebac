// `--reasoning-parser auto` (the default): the parser a model's chat template
// and vocabulary call for, or none where they do not say so unambiguously.
//
// A parser is picked only when both hold:
//   - the vocabulary spells <think> and </think> as single tokens (Qwen3, QwQ,
//     DeepSeek-R1 and their distillations, SmolLM3 do; a model whose
//     vocabulary lacks them never writes a think block on purpose), and
//   - the template marks thinking:
//       deepseek_r1  the generation prompt ends inside an open think block
//                    (<think> then whitespace: DeepSeek-R1-0528, QwQ,
//                    Qwen3-*-Thinking-2507): the output starts in the reasoning;
//       qwen3        the template has the `enable_thinking` switch and writes a
//                    think block (Qwen3's hybrid models, SmolLM3): the model
//                    opens <think> itself, enable_thinking false skips it.
// Anything else is none: a template that only strips </think> from earlier
// turns (Qwen3-Instruct-2507 never thinks), another marker (Granite's), no
// template. Pure text; never throws.
#pragma once

#include <string>
#include <string_view>

#include "reasoning/reasoning_parser.h"

namespace loom::reasoning {

struct ReasoningDetection {
  ReasoningKind kind = ReasoningKind::kNone;
  std::string reason;  // why, for the start-up log line
};

// `template_source`: the served chat template's source; `generation_prompt`:
// that template rendered for one user message with add_generation_prompt
// ("" when it could not be rendered); `has_think_tokens`: whether the
// vocabulary has <think> and </think> as tokens of their own.
ReasoningDetection detect_reasoning_parser(std::string_view template_source, std::string_view generation_prompt,
                                           bool has_think_tokens);

}  // namespace loom::reasoning
