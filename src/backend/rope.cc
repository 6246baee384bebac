#include "backend/rope.h"

#include <cmath>
#include <numbers>

namespace loom {

Rope::Rope(const ModelConfig& config) : head_dim_(config.head_dim) {
  const int half = head_dim_ / 2;
  inverse_frequencies_.resize(half);
  const float dim = static_cast<float>(head_dim_);
  for (int i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / dim;
    const float power = static_cast<float>(std::pow(static_cast<double>(config.rope_theta), exponent));
    inverse_frequencies_[i] = 1.0f / power;
  }
  if (config.rope_scaling.type != RopeScaling::Type::kLlama3) return;

  const RopeScaling& scaling = config.rope_scaling;
  const float old_context = static_cast<float>(scaling.original_max_position_embeddings);
  const float low_freq_wavelen = old_context / scaling.low_freq_factor;
  const float high_freq_wavelen = old_context / scaling.high_freq_factor;
  for (int i = 0; i < half; ++i) {
    const float inv_freq = inverse_frequencies_[i];
    const float wavelen = static_cast<float>(2.0 * std::numbers::pi) / inv_freq;
    if (wavelen > low_freq_wavelen) {
      inverse_frequencies_[i] = inv_freq / scaling.factor;
    } else if (!(wavelen < high_freq_wavelen)) {
      // Medium frequencies: interpolate between scaled and unscaled.
      const float smooth = (old_context / wavelen - scaling.low_freq_factor) /
                           (scaling.high_freq_factor - scaling.low_freq_factor);
      inverse_frequencies_[i] = (1.0f - smooth) * inv_freq / scaling.factor + smooth * inv_freq;
    }
  }
}

void Rope::cos_sin(int64_t position, float* cos_out, float* sin_out) const {
  const float position_float = static_cast<float>(position);
  const int half = head_dim_ / 2;
  for (int i = 0; i < half; ++i) {
    const float angle = inverse_frequencies_[i] * position_float;
    // Through double so the fp32 result is the correctly rounded one.
    cos_out[i] = static_cast<float>(std::cos(static_cast<double>(angle)));
    sin_out[i] = static_cast<float>(std::sin(static_cast<double>(angle)));
  }
}

void Rope::rotate(float* heads, int num_heads, const float* cos_table, const float* sin_table) const {
  const int half = head_dim_ / 2;
  for (int head = 0; head < num_heads; ++head) {
    float* first = heads + static_cast<int64_t>(head) * head_dim_;
    float* second = first + half;
#pragma omp simd
    for (int i = 0; i < half; ++i) {
      const float x1 = first[i];
      const float x2 = second[i];
      first[i] = x1 * cos_table[i] - x2 * sin_table[i];
      second[i] = x2 * cos_table[i] + x1 * sin_table[i];
    }
  }
}

}  // namespace loom
