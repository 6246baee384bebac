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
#include <utility>
#include <vector>

#include "backend/backend.h"
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
  // For a backend that draws itself (backend.h DeviceSampling): appends what
  // sample() would do to the logits before its choice, one LogitEdit per token
  // it touches (logit_bias, repetition over prompt and output, presence and
  // frequency over the output so far).
  void append_logit_edits(int32_t vocab_size, std::vector<LogitEdit>& edits) const;
  // A token drawn elsewhere: counted as output for the penalties, as sample() does.
  void note_output_token(int32_t token_id);

 private:
  void adjust(std::vector<float>& logits) const;
  // The entry of `token` in touched_, added if new.
  size_t touch(int32_t token);
  // touched_[i]'s edit now (subtract from its output count).
  LogitEdit edit_of(size_t i) const;

  SamplingParams params_;
  Prng prng_;
  std::vector<std::pair<float, int32_t>> scratch_;
  std::vector<float> adjusted_;
  // Every token the processing touches (biased, in the prompt under a
  // repetition penalty, or produced), once each, with its output count: kept
  // up to date as tokens come, so a step's edits are a pass over it.
  struct Touched {
    int32_t token = 0;
    float bias = 0.0f;
    bool repeated = false;
    int32_t count = 0;
  };
  std::vector<Touched> touched_;
  std::unordered_map<int32_t, size_t> touched_index_;
};

}  // namespace loom
