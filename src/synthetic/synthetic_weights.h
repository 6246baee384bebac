// Deterministic random tensors for synthetic models (internal to
// synthetic/synthetic_*.cc; see synthetic/synthetic_model.h for the scales and guarantees).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "lora/adapter.h"
#include "model/config.h"
#include "model/weights.h"
#include "util/prng.h"

namespace loom {

// Gains that keep a random model "alive": sharper attention (q and k, or the
// q/k norms, times 3), a residual stream dominated by the layers rather than
// the token's own embedding (o_proj and down_proj times 4), and logits with a
// standard deviation of about 2 (lm_head, or the final norm when tied, times 4).
// Without them greedy decoding repeats the last token forever.
inline constexpr float kAttentionGain = 3.0f;
inline constexpr float kResidualGain = 4.0f;
inline constexpr float kLogitGain = 4.0f;

// The gain of a projection's weight (and of its LoRA B, so that adapters move
// every module by the same relative amount).
float synthetic_linear_gain(const ModelConfig& config, LoraTarget target);

// value = uniform(-1, 1) * scale, or (1 + uniform(-1, 1) / 8) * scale for norm weights.
struct SyntheticTensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool is_norm = false;
  float scale = 1.0f;

  int64_t numel() const;
};

// Every tensor of the base model, HF names, sorted by name.
std::vector<SyntheticTensorSpec> synthetic_base_tensor_specs(const ModelConfig& config);

// The per-tensor PRNG seed: the run's seed mixed with the FNV-1a hash of `name`.
uint64_t synthetic_tensor_seed(uint64_t seed, const std::string& name);

// Draws a tensor's values in order; values [i, i + n) are the same whether
// drawn at once or in chunks.
class SyntheticValueStream {
 public:
  SyntheticValueStream(const SyntheticTensorSpec& spec, uint64_t seed);
  void next(float* out, int64_t count);

 private:
  Prng prng_;
  bool is_norm_;
  float scale_;
};

// The whole tensor in memory (f32).
Tensor make_synthetic_tensor(const SyntheticTensorSpec& spec, uint64_t seed);

// Writes the tensors to one safetensors file without holding any of them:
// header first (names sorted, tensors tiling the data section, header padded
// to 8 bytes), then each tensor generated and converted chunk by chunk.
// Throws Error(kInvalidArgument) naming `path` if it cannot be written.
void write_synthetic_safetensors(const std::string& path, const std::vector<SyntheticTensorSpec>& specs,
                                 uint64_t seed, StoredDtype dtype);

}  // namespace loom
