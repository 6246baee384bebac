#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "util/error.h"
#include "util/vector_math.h"

namespace loom {

Sampler::Sampler(const SamplingParams& params) : params_(params), prng_(params.seed) {
  if (!(params.temperature >= 0.0f) || !std::isfinite(params.temperature))
    fail(ErrorKind::kInvalidArgument, "temperature must be >= 0, got {}", params.temperature);
  if (params.top_k < 0) fail(ErrorKind::kInvalidArgument, "top_k must be >= 0, got {}", params.top_k);
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f))
    fail(ErrorKind::kInvalidArgument, "top_p must be in (0, 1], got {}", params.top_p);
  if (params.num_top_logprobs < 0)
    fail(ErrorKind::kInvalidArgument, "logprobs must be >= 0, got {}", params.num_top_logprobs);
  for (const auto& [name, value] : {std::pair{"presence_penalty", params.presence_penalty},
                                    std::pair{"frequency_penalty", params.frequency_penalty}})
    if (!(value >= -2.0f && value <= 2.0f)) fail(ErrorKind::kInvalidArgument, "{} must be in [-2, 2], got {}", name, value);
  if (!(params.repetition_penalty > 0.0f) || !std::isfinite(params.repetition_penalty))
    fail(ErrorKind::kInvalidArgument, "repetition_penalty must be > 0, got {}", params.repetition_penalty);
  if (!(params.min_p >= 0.0f && params.min_p <= 1.0f))
    fail(ErrorKind::kInvalidArgument, "min_p must be in [0, 1], got {}", params.min_p);
  for (const auto& [id, bias] : params.logit_bias)
    if (id < 0 || !(bias >= -100.0f && bias <= 100.0f))
      fail(ErrorKind::kInvalidArgument, "logit_bias: token {} bias {} (ids >= 0, biases in [-100, 100])", id, bias);
  for (const auto& [id, bias] : params.logit_bias) touched_[touch(id)].bias += bias;
}

void Sampler::set_prompt(std::span<const int32_t> prompt_tokens) {
  if (params_.repetition_penalty == 1.0f) return;
  for (int32_t id : prompt_tokens) touched_[touch(id)].repeated = true;
}

size_t Sampler::touch(int32_t token) {
  auto [it, added] = touched_index_.try_emplace(token, touched_.size());
  if (added) touched_.push_back({token, 0.0f, false, 0});
  return it->second;
}

LogitEdit Sampler::edit_of(size_t i) const {
  const Touched& entry = touched_[i];
  const float subtract = entry.count > 0 ? params_.frequency_penalty * static_cast<float>(entry.count) +
                                               params_.presence_penalty
                                         : 0.0f;
  return {entry.token, entry.bias, subtract, entry.repeated ? 1 : 0};
}

void Sampler::adjust(std::vector<float>& logits) const {
  const auto vocab_size = static_cast<int32_t>(logits.size());
  for (size_t i = 0; i < touched_.size(); ++i) {
    const LogitEdit edit = edit_of(i);
    if (edit.token < 0 || edit.token >= vocab_size) continue;
    float& logit = logits[static_cast<size_t>(edit.token)];
    logit += edit.bias;
    if (edit.repeated) logit = logit > 0.0f ? logit / params_.repetition_penalty : logit * params_.repetition_penalty;
    logit -= edit.subtract;
  }
}

void Sampler::append_logit_edits(int32_t vocab_size, std::vector<LogitEdit>& edits) const {
  if (!params_.modifies_logits()) return;
  for (size_t i = 0; i < touched_.size(); ++i) {
    const LogitEdit edit = edit_of(i);
    if (edit.token < 0 || edit.token >= vocab_size) continue;
    if (edit.bias == 0.0f && edit.subtract == 0.0f && !edit.repeated) continue;  // changes nothing
    edits.push_back(edit);
  }
}

void Sampler::note_output_token(int32_t token_id) {
  if (!params_.modifies_logits()) return;
  Touched& entry = touched_[touch(token_id)];
  ++entry.count;
  if (params_.repetition_penalty != 1.0f) entry.repeated = true;
}

SampledToken Sampler::sample(const float* raw_logits, int32_t vocab_size) {
  LOOM_CHECK(vocab_size > 0);
  // log-softmax of the raw logits: fp32 terms, vectorised, summed in fp64 (a
  // 128K vocabulary in ~0.2 ms a row on one core, where a scalar fp64 exp took 1.5 ms).
  const float max_raw = max_value(raw_logits, vocab_size);
  const double log_normalizer = static_cast<double>(max_raw) + std::log(exp_shifted_sum(raw_logits, vocab_size, max_raw));
  auto logprob_of = [&](int32_t id) { return static_cast<float>(raw_logits[id] - log_normalizer); };

  // The choice is made on the adjusted logits.
  const float* logits = raw_logits;
  if (params_.modifies_logits()) {
    adjusted_.assign(raw_logits, raw_logits + vocab_size);
    adjust(adjusted_);
    logits = adjusted_.data();
  }
  // The first index holding the largest value (lowest id on ties; 0 where none compares, as for a NaN first entry).
  const float best = logits == raw_logits ? max_raw : max_value(logits, vocab_size);
  const float* found = std::find(logits, logits + vocab_size, best);
  const int32_t argmax = found == logits + vocab_size ? 0 : static_cast<int32_t>(found - logits);

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
    // Masked tokens (structured outputs, min_tokens) have weight 0: never drawn, even by rounding.
    while (keep > 1 && scratch_[keep - 1].first == -std::numeric_limits<float>::infinity()) --keep;

    std::vector<double> weights(keep);
    const double inverse_temperature = 1.0 / params_.temperature;
    double total = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      weights[i] = std::exp((scratch_[i].first - scratch_[0].first) * inverse_temperature);
      // min_p: weights are probabilities relative to the most likely token's (weights[0] == 1).
      if (weights[i] < params_.min_p) {
        keep = i;
        break;
      }
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
  note_output_token(result.token_id);

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
