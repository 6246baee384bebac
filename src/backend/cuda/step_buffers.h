// The activations of a CUDA step, grown to the largest step seen (never shrunk).
// Owns the device memory; addresses stay valid until the next grow() that grows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/step_plan.h"
#include "model/config.h"

namespace loom::cuda {

struct StepBuffers {
  DeviceBuffer residual;       // [rows, hidden] fp32: the residual stream
  DeviceBuffer delta;          // [rows, hidden] fp32: o_proj / down_proj output
  DeviceBuffer normed;         // [rows, hidden] bf16
  DeviceBuffer qkv;            // [rows, q + 2 kv] fp32
  DeviceBuffer q;              // [rows, q] bf16
  DeviceBuffer attention_out;  // [rows, q] bf16
  DeviceBuffer gate_up;        // [rows, 2 intermediate] bf16
  DeviceBuffer activation;     // [rows, intermediate] bf16
  DeviceBuffer partial_out, partial_lse;  // split attention's partial results
  DeviceBuffer logits;         // [logit launch rows, vocab] fp32
  DeviceBuffer hidden_states;  // [num_layers + 1][logit rows][hidden] fp32 when capturing
  // FP8 weights only: a GEMM's activations quantized ([rows, max k] e4m3; its
  // fp32 scale, then the quantizer's sync words), and the largest linear weight dequantized to
  // bf16 for shapes the FP8 GEMM refuses (one matrix at a time).
  DeviceBuffer fp8_activations, fp8_activation_scales;
  DeviceBuffer fp8_weight;

  void grow(const StepPlan& plan, const ModelConfig& config, bool capture_hidden_states, bool fp8 = false);
  // Every address a captured step holds.
  std::vector<const void*> addresses() const;
};

}  // namespace loom::cuda
