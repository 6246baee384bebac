// End-to-end helpers of the CUDA backend's tests (cuda_backend_test.cc,
// cuda_sharing_test.cc): the tiny synthetic models' weights as the GPU holds
// them, for the CPU reference, and the logits check between the two backends.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "lora/adapter.h"
#include "model/config.h"
#include "model/weights.h"

namespace loom::cuda::test {

// The tiny model's weights; with `bf16_matrices` every 2-D tensor is rounded
// to bf16 (what the GPU holds), so that the CPU reference sees the same weights.
std::shared_ptr<ModelWeights> tiny_weights(const ModelConfig& config, uint64_t seed, bool bf16_matrices);
// A copy of the adapter with A and B rounded to bf16 (what the GPU holds).
std::shared_ptr<const LoraAdapter> rounded_adapter(const LoraAdapter& adapter);

int argmax(const float* row, int count);

// End to end the GPU rounds activations to bf16 at every GEMM input and keeps
// K/V in bf16; on the tiny models, whose q/k gains make attention very sharp,
// that moves logits by up to ~0.3. The check: the same rows, no NaN, NMSE <=
// max_nmse, and the argmax may differ only where the reference's top two are
// within kNearTie. Updates *worst_nmse when given.
inline constexpr float kNearTie = 0.15f;
void expect_logits_close(const ForwardResult& out, const ForwardResult& ref, const std::string& what, double max_nmse,
                         double* worst_nmse = nullptr);

}  // namespace loom::cuda::test
