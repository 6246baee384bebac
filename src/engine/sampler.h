// Turns one row of logits into a token: greedy, or temperature / min-p / top-k
// / top-p sampling from a seeded portable PRNG, plus logprobs.
//
// Before the choice the logits get, in this order: logit_bias (added), the
// repetition penalty (tokens of the prompt or the output so far: a positive
// logit divided by it, a negative one multiplied, as Hugging Face and vLLM),
// then frequency_penalty x count and presence_penalty x (count > 0) subtracted
// for tokens of the output so far (OpenAI). Then temperature, min_p (tokens
// below min_p x the most likely one's probability dropped), top-k, top-p.
//
// Logprobs are those of the model's raw distribution (log-softmax of the
// unmodified logits), as vLLM reports by default, whatever the sampling knobs.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <unordered_set>
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
  float presence_penalty = 0.0f;    // [-2, 2]
  float frequency_penalty = 0.0f;   // [-2, 2]
  float repetition_penalty = 1.0f;  // > 0; 1: none
  float min_p = 0.0f;               // [0, 1]; 0: none
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias in [-100, 100])

  // Whether the logits change before the choice (the device sampler does none of it).
  bool modifies_logits() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f || min_p > 0.0f ||
           !logit_bias.empty();
  }
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
  // The prompt's tokens, for the repetition penalty (call before the first sample).
  void set_prompt(std::span<const int32_t> prompt_tokens);
  // `logits` has vocab_size entries. Throws Error(kInvalidArgument) on bad params.
  // With modifies_logits(), the chosen token counts as output for the penalties.
  SampledToken sample(const float* logits, int32_t vocab_size);

 private:
  void adjust(std::vector<float>& logits) const;

  SamplingParams params_;
  Prng prng_;
  std::vector<std::pair<float, int32_t>> scratch_;
  std::vector<float> adjusted_;
  std::unordered_set<int32_t> prompt_tokens_;
  std::unordered_map<int32_t, int32_t> output_counts_;
};

}  // namespace loom
