// Turns one row of logits into a token: greedy, or temperature / top-k / top-p
// sampling from a seeded portable PRNG, plus logprobs.
//
// Logprobs are those of the model's raw distribution (log-softmax of the
// unmodified logits), as vLLM reports by default, whatever the sampling knobs.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "util/prng.h"

namespace loom {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax, lowest id on ties)
  int top_k = 0;             // 0: no limit
  float top_p = 1.0f;        // 1: no nucleus cut
  uint64_t seed = 0;
  int num_top_logprobs = 0;  // alternatives reported per position
};

struct SampledToken {
  int32_t token_id = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs;  // best first
};

// One per sequence (it owns the sequence's PRNG stream). Not thread-safe.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // `logits` has vocab_size entries. Throws Error(kInvalidArgument) on bad params.
  SampledToken sample(const float* logits, int32_t vocab_size);

 private:
  SamplingParams params_;
  Prng prng_;
  std::vector<std::pair<float, int32_t>> scratch_;
};

}  // namespace loom
