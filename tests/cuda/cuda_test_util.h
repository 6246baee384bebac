// Helpers for the CUDA backend's tests: host<->device copies, bf16 rounding,
// deterministic random data and the closeness checks of the issue
// (elementwise rtol 1.6e-2 / atol 1e-3, or NMSE <= 1e-4 for long reductions).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/step_plan.h"
#include "util/prng.h"

namespace loom::cuda::test {

// Skips the calling test when no Hopper GPU is present.
#define LOOM_REQUIRE_GPU()                                                         \
  do {                                                                             \
    if (!::loom::cuda::test::has_hopper_gpu()) GTEST_SKIP() << "no sm_90 GPU here"; \
  } while (0)
bool has_hopper_gpu();
// CUDA devices this process sees (0 when the runtime finds none).
int visible_gpus();

float round_to_bf16(float value);
std::vector<float> round_to_bf16(std::vector<float> values);

// Uniform in [-scale, scale), rounded to bf16 when `bf16` (so the CPU reference
// sees exactly the values the GPU gets).
std::vector<float> random_values(Prng& prng, size_t count, float scale, bool bf16 = true);

DeviceBuffer upload_bf16(const std::vector<float>& values);
DeviceBuffer upload_f32(const std::vector<float>& values);
template <typename T>
DeviceBuffer upload(const std::vector<T>& values);
std::vector<float> download_bf16(const void* device, size_t count);
std::vector<float> download_f32(const void* device, size_t count);

struct Closeness {
  double nmse = 0.0;             // sum (out - ref)^2 / sum ref^2
  double max_abs_error = 0.0;
  size_t num_outside = 0;        // elements with |out - ref| > atol + rtol |ref|
  size_t first_outside = 0;
  bool has_nan = false;
  std::string describe() const;
};
Closeness compare(const std::vector<float>& out, const std::vector<float>& ref, double rtol = 1.6e-2,
                  double atol = 1e-3);

// A KV pool in the CPU backend's layout ([slot][kv head][head_dim]) in the
// GPU's (head-major within each block, plan_types.h's kv_element_index).
std::vector<float> kv_pool_device_layout(const std::vector<float>& pool, int64_t num_slots, int32_t num_kv_heads,
                                         int32_t head_dim, int32_t block_size);

// AttentionParams of the plan uploaded at `plan_words` (the shapes, scale
// 1 / sqrt(head_dim), block tables and sequences; the caller sets the buffers).
AttentionParams plan_attention_params(const StepPlan& plan, const int32_t* plan_words, int32_t num_heads,
                                      int32_t num_kv_heads, int32_t head_dim, int32_t block_size);

// Elementwise within bf16 tolerances; or, for long reductions, NMSE <= 1e-4.
::testing::AssertionResult close_bf16(const std::vector<float>& out, const std::vector<float>& ref,
                                      bool long_reduction = false);

}  // namespace loom::cuda::test
