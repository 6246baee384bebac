// Rotary position embedding in Hugging Face's rotate-half convention:
// for i < d/2, with angle = position * inv_freq[i],
//   out[i]       = x[i] * cos - x[i + d/2] * sin
//   out[i + d/2] = x[i + d/2] * cos + x[i] * sin
// inv_freq follows transformers' _compute_default_rope_parameters (theta^(-2i/d))
// and _compute_llama3_parameters when config.rope_scaling says llama3, with the
// same fp32 arithmetic so that the angles round as torch rounds them.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace loom {

// Immutable after construction; shared freely between threads.
class Rope {
 public:
  explicit Rope(const ModelConfig& config);

  int head_dim() const { return head_dim_; }
  const std::vector<float>& inverse_frequencies() const { return inverse_frequencies_; }

  // Fills cos/sin[head_dim / 2] for one position (fp32 angle, as torch computes it).
  void cos_sin(int64_t position, float* cos_out, float* sin_out) const;

  // Rotates `num_heads` consecutive heads of head_dim floats in place, using
  // the tables from cos_sin for this token's position.
  void rotate(float* heads, int num_heads, const float* cos_table, const float* sin_table) const;

 private:
  int head_dim_;
  std::vector<float> inverse_frequencies_;  // [head_dim / 2]
};

}  // namespace loom
