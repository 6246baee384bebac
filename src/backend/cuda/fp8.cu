// FP8 (e4m3) for --quantization fp8 (kernels.h): weights quantized once at load
// with one scale per output row (per channel), activations quantized per token
// before each FP8 GEMM, and weights dequantized to bf16 for the GEMMs cuBLASLt
// cannot run in FP8.
#include <cuda_fp8.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace loom::cuda {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float block_max(float value, float* shared) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < blockDim.x / 32 ? shared[lane] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
    if (lane == 0) shared[0] = value;
  }
  __syncthreads();
  return shared[0];
}

// One block a row: its max |x|, then e4m3(x / s) with s = max / 448. The row is
// read twice; the second read comes from L1/L2.
__global__ void __launch_bounds__(kThreads)
    quantize_rows_kernel(const bf16* x, int64_t cols, int64_t x_stride, uint8_t* out, float* scales) {
  __shared__ float shared[kThreads / 32];
  const bf16* row = x + blockIdx.x * x_stride;
  float local = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) local = fmaxf(local, fabsf(__bfloat162float(row[c])));
  const float amax = block_max(local, shared);
  const float s = amax > 0.0f ? amax / kFp8E4m3Max : 1.0f;
  if (threadIdx.x == 0) scales[blockIdx.x] = s;
  const float inverse = 1.0f / s;
  uint8_t* out_row = out + blockIdx.x * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    out_row[c] = __nv_cvt_float_to_fp8(__bfloat162float(row[c]) * inverse, __NV_SATFINITE, __NV_E4M3);
}

// Per-tensor quantization in one launch: every block takes the max |x| of its
// share, the blocks meet at a barrier in `sync` (all are resident: the grid is at
// most kQuantizeBlocksPerSm blocks an SM and the kernel allows that many), then each quantizes its share
// with the common scale. The last block out resets `sync` to zero for the next
// launch. Non-negative floats order as their bit patterns, so atomicMax on the
// bits is a float max.
constexpr int kQuantizeBlocksPerSm = 4;

struct QuantizeSync {
  uint32_t amax_bits, arrived, departed;
};

__device__ __forceinline__ uint4 load_eight(const bf16* x, int64_t group, int64_t cols8, int64_t x_stride) {
  return *reinterpret_cast<const uint4*>(x + group / cols8 * x_stride + group % cols8 * 8);
}

__global__ void __launch_bounds__(kThreads, kQuantizeBlocksPerSm)
    quantize_tensor_kernel(const bf16* x, int64_t groups, int64_t cols8, int64_t x_stride, uint8_t* out, float* scales,
                           int64_t copies, QuantizeSync* sync) {
  __shared__ float shared[kThreads / 32];
  const int64_t begin = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  float local = 0.0f;
  for (int64_t g = begin; g < groups; g += stride) {
    const uint4 packed = load_eight(x, g, cols8, x_stride);
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const float2 f = __bfloat1622float2(pairs[p]);
      local = fmaxf(local, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
  }
  const float block_amax = block_max(local, shared);
  if (threadIdx.x == 0) {
    atomicMax(&sync->amax_bits, __float_as_uint(block_amax));
    __threadfence();
    atomicAdd(&sync->arrived, 1u);
    while (atomicAdd(&sync->arrived, 0u) < gridDim.x) __nanosleep(64);
    shared[0] = __uint_as_float(atomicAdd(&sync->amax_bits, 0u));
  }
  __syncthreads();
  const float amax = shared[0];
  const float s = amax > 0.0f ? amax / kFp8E4m3Max : 1.0f;
  const float inverse = 1.0f / s;
  for (int64_t i = begin; i < copies; i += stride) scales[i] = s;
  for (int64_t g = begin; g < groups; g += stride) {
    const uint4 packed = load_eight(x, g, cols8, x_stride);
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
    uint2 bytes;
    __nv_fp8x2_storage_t* fp8 = reinterpret_cast<__nv_fp8x2_storage_t*>(&bytes);
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      const float2 f = __bfloat1622float2(pairs[p]);
      fp8[p] = __nv_cvt_float2_to_fp8x2(make_float2(f.x * inverse, f.y * inverse), __NV_SATFINITE, __NV_E4M3);
    }
    reinterpret_cast<uint2*>(out)[g] = bytes;
  }
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&sync->departed, 1u) == gridDim.x - 1) {
      sync->amax_bits = 0;
      sync->arrived = 0;
      sync->departed = 0;
      __threadfence();
    }
  }
}

int resident_blocks() {
  static const int blocks = [] {
    int device = 0, sms = 0;
    LOOM_CUDA_CHECK(cudaGetDevice(&device));
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    return kQuantizeBlocksPerSm * sms;
  }();
  return blocks;
}

// Eight values a thread: one 8-byte load, one 16-byte store (cols % 8 == 0, so
// the eight share a row).
__global__ void dequantize_kernel(const uint2* w, const float* scales, int64_t cols8, int64_t count8, uint4* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count8;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float s = scales[i / cols8];
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

__global__ void requantize_rows_kernel(uint8_t* data, const float* scales, int64_t cols, int64_t count, float common) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float factor = scales[i / cols] / common;
    if (factor == 1.0f) continue;
    const float value = __half2float(__half(__nv_cvt_fp8_to_halfraw(data[i], __NV_E4M3)));
    data[i] = __nv_cvt_float_to_fp8(value * factor, __NV_SATFINITE, __NV_E4M3);
  }
}

}  // namespace

void launch_fp8_requantize_rows(uint8_t* data, const float* scales, int64_t rows, int64_t cols, float common,
                                cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  const int64_t count = rows * cols;
  const int blocks = static_cast<int>(std::min<int64_t>((count + kThreads - 1) / kThreads, 132 * 16));
  requantize_rows_kernel<<<blocks, kThreads, 0, stream>>>(data, scales, cols, count, common);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void launch_fp8_dequantize(const uint8_t* w, const float* scales, int64_t rows, int64_t cols, bf16* out,
                           cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  if (cols % 8 != 0 || reinterpret_cast<uintptr_t>(w) % 8 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0)
    throw_unsupported("cuda FP8 dequantize: columns a multiple of 8, aligned pointers", cols);
  const int64_t count8 = rows * cols / 8;
  const int blocks = static_cast<int>(std::min<int64_t>((count8 + kThreads - 1) / kThreads, 132 * 16));
  dequantize_kernel<<<blocks, kThreads, 0, stream>>>(reinterpret_cast<const uint2*>(w), scales, cols / 8, count8,
                                                      reinterpret_cast<uint4*>(out));
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void launch_fp8_quantize_tensor(const bf16* x, int64_t rows, int64_t cols, int64_t x_stride, uint8_t* out,
                                float* scales, int64_t copies, uint32_t* sync, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  if (copies < 1 || copies > rows * cols) throw_unsupported("cuda FP8 quantize: scale copies", copies);
  if (cols % 8 != 0 || x_stride % 8 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(out) % 8 != 0)
    throw_unsupported("cuda FP8 quantize: columns and row stride multiples of 8, aligned pointers", cols);
  const int64_t groups = rows * cols / 8;
  const int blocks = static_cast<int>(std::min<int64_t>((groups + 4 * kThreads - 1) / (4 * kThreads), resident_blocks()));
  quantize_tensor_kernel<<<blocks, kThreads, 0, stream>>>(x, groups, cols / 8, x_stride, out, scales, copies,
                                                           reinterpret_cast<QuantizeSync*>(sync));
  LOOM_CUDA_CHECK(cudaGetLastError());
}

void launch_fp8_quantize_rows(const bf16* x, int64_t rows, int64_t cols, int64_t x_stride, uint8_t* out,
                              float* scales, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  if (rows > INT32_MAX) throw_unsupported("cuda FP8 quantize: rows", rows);
  quantize_rows_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, cols, x_stride, out, scales);
  LOOM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace loom::cuda
