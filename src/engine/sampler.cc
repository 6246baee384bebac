#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace loom {

Sampler::Sampler(const SamplingParams& params) : params_(params), prng_(params.seed) {
  if (!(params.temperature >= 0.0f) || !std::isfinite(params.temperature))
    fail(ErrorKind::kInvalidArgument, "temperature must be >= 0, got {}", params.temperature);
  if (params.top_k < 0) fail(ErrorKind::kInvalidArgument, "top_k must be >= 0, got {}", params.top_k);
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f))
    fail(ErrorKind::kInvalidArgument, "top_p must be in (0, 1], got {}", params.top_p);
  if (params.num_top_logprobs < 0)
    fail(ErrorKind::kInvalidArgument, "logprobs must be >= 0, got {}", params.num_top_logprobs);
}

SampledToken Sampler::sample(const float* logits, int32_t vocab_size) {
  LOOM_CHECK(vocab_size > 0);
  // log-softmax of the raw logits, in double for stable logprobs.
  float max_logit = logits[0];
  int32_t argmax = 0;
  for (int32_t i = 1; i < vocab_size; ++i) {
    if (logits[i] > max_logit) {
      max_logit = logits[i];
      argmax = i;
    }
  }
  double sum = 0.0;
  for (int32_t i = 0; i < vocab_size; ++i) sum += std::exp(static_cast<double>(logits[i] - max_logit));
  const double log_normalizer = static_cast<double>(max_logit) + std::log(sum);
  auto logprob_of = [&](int32_t id) { return static_cast<float>(logits[id] - log_normalizer); };

  SampledToken result;
  result.token_id = argmax;
  if (params_.temperature > 0.0f) {
    // Candidates sorted by logit (descending, ties by id) so the draw is reproducible.
    scratch_.clear();
    scratch_.reserve(static_cast<size_t>(vocab_size));
    for (int32_t i = 0; i < vocab_size; ++i) scratch_.emplace_back(logits[i], i);
    auto by_logit = [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    };
    size_t keep = scratch_.size();
    if (params_.top_k > 0) keep = std::min(keep, static_cast<size_t>(params_.top_k));
    std::partial_sort(scratch_.begin(), scratch_.begin() + static_cast<ptrdiff_t>(keep), scratch_.end(), by_logit);
    scratch_.resize(keep);

    std::vector<double> weights(keep);
    const double inverse_temperature = 1.0 / params_.temperature;
    double total = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      weights[i] = std::exp((scratch_[i].first - scratch_[0].first) * inverse_temperature);
      total += weights[i];
    }
    if (params_.top_p < 1.0f) {
      double cumulative = 0.0;
      size_t cut = keep;
      for (size_t i = 0; i < keep; ++i) {
        cumulative += weights[i] / total;
        if (cumulative >= params_.top_p) {
          cut = i + 1;
          break;
        }
      }
      keep = cut;
      total = 0.0;
      for (size_t i = 0; i < keep; ++i) total += weights[i];
    }
    double draw = static_cast<double>(prng_.next_u64() >> 11) * (1.0 / 9007199254740992.0) * total;
    size_t chosen = keep - 1;
    for (size_t i = 0; i < keep; ++i) {
      draw -= weights[i];
      if (draw < 0.0) {
        chosen = i;
        break;
      }
    }
    result.token_id = scratch_[chosen].second;
  }
  result.logprob = logprob_of(result.token_id);

  if (params_.num_top_logprobs > 0) {
    const int32_t count = std::min(params_.num_top_logprobs, vocab_size);
    std::vector<int32_t> ids(static_cast<size_t>(vocab_size));
    for (int32_t i = 0; i < vocab_size; ++i) ids[static_cast<size_t>(i)] = i;
    std::partial_sort(ids.begin(), ids.begin() + count, ids.end(), [&](int32_t a, int32_t b) {
      return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
    });
    for (int32_t i = 0; i < count; ++i) result.top_logprobs.emplace_back(ids[static_cast<size_t>(i)], logprob_of(ids[static_cast<size_t>(i)]));
  }
  return result;
}

}  // namespace loom
