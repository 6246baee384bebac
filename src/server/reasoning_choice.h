// The server's reasoning parser from --reasoning-parser: a name, or "auto"
// (the default: reasoning/reasoning_detection.h decides from the served chat
// template and the vocabulary).
#pragma once

#include <string_view>

#include "chat/chat_renderer.h"
#include "reasoning/reasoning_detection.h"
#include "tokenizer/tokenizer.h"

namespace loom::server {

// `template_source` is the served template's source (what `renderer` renders
// without tools); auto renders it for one user message to see the generation
// prompt (a render error counts as no prompt). Throws Error(kInvalidArgument)
// for an unknown name.
reasoning::ReasoningDetection resolve_reasoning_parser(std::string_view name, std::string_view template_source,
                                                       const ChatRenderer& renderer, const Tokenizer& tokenizer);

}  // namespace loom::server
