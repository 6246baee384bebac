// FP8 (e4m3) weights for --quantization fp8 (kernels.h): quantized once at
// load with a per-tensor scale (as vLLM's dynamic fp8 quantizes weights), and
// dequantized to bf16 for the GEMMs of steps larger than the skinny kernel's.
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace loom::cuda {

namespace {

constexpr int kThreads = 256;

// Non-negative floats order as their bit patterns, so atomicMax on the bits is a float max.
__global__ void amax_kernel(const bf16* x, int64_t rows, int64_t cols, int64_t x_stride, uint32_t* amax_bits) {
  float local = 0.0f;
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    local = fmaxf(local, fabsf(__bfloat162float(x[r * x_stride + c])));
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) local = fmaxf(local, __shfl_xor_sync(0xffffffffu, local, offset));
  if (threadIdx.x % 32 == 0) atomicMax(amax_bits, __float_as_uint(local));
}

__global__ void quantize_kernel(const bf16* x, int64_t rows, int64_t cols, int64_t x_stride,
                                const uint32_t* amax_bits, uint8_t* out, float* scale) {
  const float amax = __uint_as_float(*amax_bits);
  const float s = amax > 0.0f ? amax / kFp8E4m3Max : 1.0f;
  if (blockIdx.x == 0 && threadIdx.x == 0) *scale = s;
  const float inverse = 1.0f / s;
  const int64_t total = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float value = __bfloat162float(x[r * x_stride + c]) * inverse;
    out[i] = __nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3);
  }
}

// Eight values a thread: one 8-byte load, one 16-byte store.
__global__ void dequantize_kernel(const uint2* w, const float* scale, int64_t count8, uint4* out) {
  const float s = *scale;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count8;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint2 bits = w[i];
    const __nv_fp8x2_storage_t* pairs = reinterpret_cast<const __nv_fp8x2_storage_t*>(&bits);
    uint4 packed;
    __nv_bfloat162* values = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pairs[p], __NV_E4M3)));
      values[p] = __floats2bfloat162_rn(f.x * s, f.y * s);
    }
    out[i] = packed;
  }
}

}  // namespace

void launch_fp8_dequantize(const uint8_t* w, const float* scale, int64_t count, bf16* out, cudaStream_t stream) {
  if (count <= 0) return;
  if (count % 8 != 0 || reinterpret_cast<uintptr_t>(w) % 8 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0)
    throw_unsupported("cuda FP8 dequantize: count a multiple of 8, aligned pointers", count);
  const int64_t count8 = count / 8;
  const int blocks = static_cast<int>(std::min<int64_t>((count8 + kThreads - 1) / kThreads, 132 * 16));
  dequantize_kernel<<<blocks, kThreads, 0, stream>>>(reinterpret_cast<const uint2*>(w), scale, count8,
                                                      reinterpret_cast<uint4*>(out));
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void launch_fp8_quantize(const bf16* x, int64_t rows, int64_t cols, int64_t x_stride, uint8_t* out, float* scale,
                         uint32_t* amax_scratch, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t total = rows * cols;
  const int blocks = static_cast<int>(std::min<int64_t>((total + kThreads - 1) / kThreads, 132 * 16));
  LOOM_CUDA_CHECK(cudaMemsetAsync(amax_scratch, 0, sizeof(uint32_t), stream));
  amax_kernel<<<blocks, kThreads, 0, stream>>>(x, rows, cols, x_stride, amax_scratch);
  LOOM_CUDA_CHECK(cudaGetLastError());
  quantize_kernel<<<blocks, kThreads, 0, stream>>>(x, rows, cols, x_stride, amax_scratch, out, scale);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace loom::cuda
