#include "backend/cuda/step_buffers.h"

#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/plan_types.h"

namespace loom::cuda {

void StepBuffers::grow(const StepPlan& plan, const ModelConfig& config, bool capture_hidden_states, bool fp8) {
  const size_t n = static_cast<size_t>(plan.num_rows());
  const size_t hidden = config.hidden_size;
  const size_t q_size = config.q_size();
  const size_t qkv_size = q_size + 2 * config.kv_size();
  const size_t intermediate = config.intermediate_size;
  residual.reserve(n * hidden * sizeof(float));
  delta.reserve(n * hidden * sizeof(float));
  normed.reserve(n * hidden * sizeof(__nv_bfloat16));
  qkv.reserve(n * qkv_size * sizeof(float));
  q.reserve(n * q_size * sizeof(__nv_bfloat16));
  attention_out.reserve(n * q_size * sizeof(__nv_bfloat16));
  gate_up.reserve(n * 2 * intermediate * sizeof(__nv_bfloat16));
  activation.reserve(n * intermediate * sizeof(__nv_bfloat16));
  const size_t partial_rows = static_cast<size_t>(plan.num_partials()) * config.num_kv_heads * kAttentionMaxRows;
  if (partial_rows > 0) {
    partial_out.reserve(partial_rows * config.head_dim * sizeof(float));
    partial_lse.reserve(partial_rows * sizeof(float));
  }
  const size_t logit_rows = static_cast<size_t>(plan.num_logit_launch_rows());
  logits.reserve(logit_rows * static_cast<size_t>(config.vocab_size) * sizeof(float));
  if (fp8) {
    fp8_activations.reserve(n * std::max({hidden, q_size, intermediate}));
    if (fp8_activation_scales.size() == 0) {  // the scale, then the quantizer's sync words (zeroed once)
      fp8_activation_scales.allocate((1 + kFp8QuantizeSyncWords) * sizeof(float));
      LOOM_CUDA_CHECK(cudaMemset(fp8_activation_scales.data(), 0, fp8_activation_scales.size()));
    }
    fp8_weight.reserve(std::max({qkv_size * hidden, hidden * q_size, 2 * intermediate * hidden}) * sizeof(__nv_bfloat16));
  }
  if (capture_hidden_states)
    hidden_states.reserve((config.num_layers + 1) * plan.logit_rows().size() * hidden * sizeof(float));
}

std::vector<const void*> StepBuffers::addresses() const {
  return {residual.data(), delta.data(),   normed.data(),      qkv.data(),         q.data(),
          attention_out.data(), gate_up.data(), activation.data(), partial_out.data(), partial_lse.data(),
          logits.data(), fp8_activations.data(), fp8_activation_scales.data(), fp8_weight.data()};
}

}  // namespace loom::cuda
