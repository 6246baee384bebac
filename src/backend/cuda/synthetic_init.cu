// Synthetic weights drawn on the device (see kernels.h and synthetic/synthetic_weights.h).
// SplitMix64 is counter-based: draw i of a stream seeded with s is
// mix(s + (i + 1) * golden), so every element is computed independently and the
// values equal the sequential CPU stream's bit for bit.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace loom::cuda {

namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

__device__ __forceinline__ float synthetic_value(uint64_t tensor_seed, int64_t index, bool is_norm, float scale) {
  uint64_t z = tensor_seed + static_cast<uint64_t>(index + 1) * kGolden;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z = z ^ (z >> 31);
  // Prng::next_symmetric_float: (24 bits / 2^24) * 2 - 1, each step exact.
  const float unit = __fmul_rn(static_cast<float>(z >> 40), 1.0f / 16777216.0f);
  const float symmetric = __fadd_rn(__fmul_rn(unit, 2.0f), -1.0f);
  if (is_norm) return __fmul_rn(__fadd_rn(1.0f, __fmul_rn(symmetric, 0.125f)), scale);
  return __fmul_rn(symmetric, scale);
}

// Output element i's index in the whole tensor (SyntheticWindow in kernels.h).
__device__ __forceinline__ int64_t window_index(int64_t i, const SyntheticWindow& window) {
  if (window.columns == 0) return i;
  const int64_t row = i / window.columns;
  return (window.row_begin + row) * window.full_columns + window.column_begin + (i - row * window.columns);
}

__global__ void synthetic_bf16_kernel(bf16* out, int64_t count, uint64_t tensor_seed, bool is_norm, float scale,
                                      SyntheticWindow window) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(synthetic_value(tensor_seed, window_index(i, window), is_norm, scale));
}

__global__ void synthetic_f32_kernel(float* out, int64_t count, uint64_t tensor_seed, bool is_norm, float scale,
                                     bool round_to_bf16, SyntheticWindow window) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float value = synthetic_value(tensor_seed, window_index(i, window), is_norm, scale);
    out[i] = round_to_bf16 ? __bfloat162float(__float2bfloat16_rn(value)) : value;
  }
}

int grid_for(int64_t count) {
  const int64_t blocks = (count + 255) / 256;
  return static_cast<int>(blocks < 8192 ? (blocks > 0 ? blocks : 1) : 8192);
}

}  // namespace

void launch_synthetic_fill_bf16(bf16* out, int64_t count, uint64_t tensor_seed, bool is_norm, float scale,
                                cudaStream_t stream, const SyntheticWindow& window) {
  if (count == 0) return;
  synthetic_bf16_kernel<<<grid_for(count), 256, 0, stream>>>(out, count, tensor_seed, is_norm, scale, window);
  LOOM_CUDA_CHECK_LAUNCH();
}

void launch_synthetic_fill_f32(float* out, int64_t count, uint64_t tensor_seed, bool is_norm, float scale,
                               bool round_to_bf16, cudaStream_t stream, const SyntheticWindow& window) {
  if (count == 0) return;
  synthetic_f32_kernel<<<grid_for(count), 256, 0, stream>>>(out, count, tensor_seed, is_norm, scale, round_to_bf16,
                                                            window);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace loom::cuda
