// How a generation ended and what it produced: the Engine's outputs carry a
// FinishReason, and `loom generate` and the offline Generator (tests/oracles)
// collect whole results. Kept apart so engine.h needs nothing of the Generator.
#pragma once

#include <string>
#include <vector>

#include "engine/sampler.h"

namespace loom {

enum class FinishReason { kStop, kLength };
const char* finish_reason_name(FinishReason reason);

struct GenerationResult {
  std::vector<SampledToken> tokens;  // every generated token, with logprobs
  std::string text;                  // detokenized, cut before a matched stop string
  FinishReason finish_reason = FinishReason::kLength;
};

}  // namespace loom
