// Weight-streaming GEMM for decode steps of 1 to 4 rows: one warp per output
// row (two rows, gate and up, for the fused SwiGLU), 16-byte loads of W with
// eight in flight per lane (four per row for gate/up), x read through the L1
// cache, fp32 accumulation and a warp reduction. At these sizes the step only
// streams the weights, and one kernel per projection (with SwiGLU folded into
// the gate/up one) leaves fewer launches and gaps than a general GEMM. Each
// warp loads its row's first chunks before waiting for the previous kernel
// (launch.cuh), so under a programmatic launch the weight stream starts while
// that kernel drains.
#include <cuda_fp8.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

namespace loom::cuda {

namespace {

constexpr int kWarpsPerCta = 4;
// 16-byte loads in flight per lane: 8 for one row, 4 per row for gate/up's two
// (bench/README.md, "The measurements behind the CUDA defaults").
constexpr int kUnroll = 4;
constexpr int kGemmUnroll = 8;
// FP8 weights: 16-byte chunks in flight per lane and per row, and rows per warp
// (x's loads shared by them).
constexpr int kFp8Unroll = 4;
constexpr int kFp8RowsPerWarp = 2;

__device__ __forceinline__ uint4 load_streaming(const bf16* pointer) {
  uint4 value;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(value.x), "=r"(value.y), "=r"(value.z), "=r"(value.w)
               : "l"(pointer));
  return value;
}

__device__ __forceinline__ float dot8(const uint4& a, const uint4& b) {
  const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&a);
  const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&b);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fa = __bfloat1622float2(a2[i]);
    const float2 fb = __bfloat1622float2(b2[i]);
    sum += fa.x * fb.x + fa.y * fb.y;
  }
  return sum;
}

__device__ __forceinline__ float warp_sum(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// The lane's first kUnroll 16-byte chunks of a W row (when the row is long
// enough: head_fits), loaded before the kernel waits for its predecessor
// (launch.cuh): weights are nobody's output, so under a programmatic launch
// they stream in while the previous kernel finishes.
template <int U = kUnroll>
__device__ __forceinline__ bool head_fits(int k, int lane) { return lane * 8 + (U - 1) * 256 < k; }

template <int U = kUnroll>
__device__ __forceinline__ void load_row_head(const bf16* w_row, int k, int lane, uint4 (&head)[U]) {
  const bool fits = head_fits<U>(k, lane);
#pragma unroll
  for (int u = 0; u < U; ++u) head[u] = fits ? load_streaming(w_row + lane * 8 + u * 256) : make_uint4(0, 0, 0, 0);
}

template <int M, int U = kUnroll>
__device__ __forceinline__ void accumulate(const bf16* x, int x_stride, int column, const uint4 (&w)[U],
                                           float (&acc)[M]) {
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int m = 0; m < M; ++m)
      acc[m] += dot8(w[u], __ldg(reinterpret_cast<const uint4*>(x + m * x_stride + column + u * 256)));
}

// Accumulates x[m] . w_row over k for m < M (k % 8 == 0), starting with the
// chunks load_row_head put in `head`.
template <int M, int U = kUnroll>
__device__ __forceinline__ void row_dots(const bf16* x, int x_stride, const bf16* w_row, int k, int lane,
                                         const uint4 (&head)[U], float (&acc)[M]) {
  int column = lane * 8;
  if (head_fits<U>(k, lane)) {
    accumulate<M, U>(x, x_stride, column, head, acc);
    column += U * 256;
  }
  for (; column + (U - 1) * 256 < k; column += U * 256) {
    uint4 w[U];
#pragma unroll
    for (int u = 0; u < U; ++u) w[u] = load_streaming(w_row + column + u * 256);
    accumulate<M, U>(x, x_stride, column, w, acc);
  }
  for (; column < k; column += 256) {
    const uint4 w = load_streaming(w_row + column);
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] += dot8(w, __ldg(reinterpret_cast<const uint4*>(x + m * x_stride + column)));
  }
}

// Sums each row's lane partials over the warp, scales them (FP8 weights' per-row
// scale; 1 for bf16, exact) and lane 0 writes y[m * y_stride + row] for m < M.
template <int M>
__device__ __forceinline__ void store_row(const float (&acc)[M], float scale, int lane, int row, void* y,
                                          int y_stride, bool y_is_bf16) {
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float value = warp_sum(acc[m]) * scale;
    if (lane == 0) {
      if (y_is_bf16) {
        static_cast<bf16*>(y)[static_cast<int64_t>(m) * y_stride + row] = __float2bfloat16_rn(value);
      } else {
        static_cast<float*>(y)[static_cast<int64_t>(m) * y_stride + row] = value;
      }
    }
  }
}

// U 16-byte loads in flight per lane, W warps a CTA.
template <int M, int U = kGemmUnroll, int W = kWarpsPerCta>
__global__ void __launch_bounds__(W * 32)
    skinny_gemm_kernel(const bf16* x, int x_stride, const bf16* w, int n, int k, void* y, int y_stride, bool y_is_bf16) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * W + threadIdx.x / 32;
  const bf16* w_row = w + static_cast<int64_t>(row < n ? row : 0) * k;
  uint4 head[U];
  load_row_head<U>(w_row, row < n ? k : 0, lane, head);
  pdl_wait();
  pdl_trigger();
  if (row >= n) return;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  row_dots<M, U>(x, x_stride, w_row, k, lane, head, acc);
  store_row<M>(acc, 1.0f, lane, row, y, y_stride, y_is_bf16);
}

// out[m, i] = silu(x[m] . w[i]) * (x[m] . w[intermediate + i]).
template <int M>
__global__ void __launch_bounds__(kWarpsPerCta * 32)
    skinny_gate_up_kernel(const bf16* x, int x_stride, const bf16* w, int intermediate, int k, bf16* out) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarpsPerCta + threadIdx.x / 32;
  const int valid_k = row < intermediate ? k : 0;
  const bf16* gate_row = w + static_cast<int64_t>(row < intermediate ? row : 0) * k;
  const bf16* up_row = gate_row + static_cast<int64_t>(intermediate) * k;
  uint4 gate_head[kUnroll], up_head[kUnroll];
  load_row_head(gate_row, valid_k, lane, gate_head);
  load_row_head(up_row, valid_k, lane, up_head);
  pdl_wait();
  pdl_trigger();
  if (row >= intermediate) return;
  float gate[M], up[M];
#pragma unroll
  for (int m = 0; m < M; ++m) gate[m] = up[m] = 0.0f;
  row_dots<M>(x, x_stride, gate_row, k, lane, gate_head, gate);
  row_dots<M>(x, x_stride, up_row, k, lane, up_head, up);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float g = warp_sum(gate[m]);
    const float u = warp_sum(up[m]);
    // The same roundings as the unfused path: gate and up in bf16, then SwiGLU.
    const float g16 = __bfloat162float(__float2bfloat16_rn(g));
    const float u16 = __bfloat162float(__float2bfloat16_rn(u));
    if (lane == 0) out[static_cast<int64_t>(m) * intermediate + row] = __float2bfloat16_rn(g16 / (1.0f + __expf(-g16)) * u16);
  }
}

// FP8 weights: a lane's 16-byte load is 16 e4m3 values of W, matched with two
// 16-byte loads of x (16 bf16). The row's scale multiplies its sum once.
__device__ __forceinline__ uint4 load_streaming_bytes(const uint8_t* pointer) {
  return load_streaming(reinterpret_cast<const bf16*>(pointer));
}

__device__ __forceinline__ float dot16_fp8(const uint4& w, const uint4& x_low, const uint4& x_high) {
  const __nv_fp8x2_storage_t* w2 = reinterpret_cast<const __nv_fp8x2_storage_t*>(&w);
  const __nv_bfloat162* low = reinterpret_cast<const __nv_bfloat162*>(&x_low);
  const __nv_bfloat162* high = reinterpret_cast<const __nv_bfloat162*>(&x_high);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float2 fw = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(w2[i], __NV_E4M3)));
    const float2 fx = __bfloat1622float2(i < 4 ? low[i] : high[i - 4]);
    sum += fw.x * fx.x + fw.y * fx.y;
  }
  return sum;
}

// Adds x[m] . w[r] over the U chunks of each of R rows: x's chunk is loaded
// once and used for all R rows.
template <int M, int U, int R>
__device__ __forceinline__ void accumulate_fp8(const bf16* x, int x_stride, int column, const uint4 (&w)[R][U],
                                               float (&acc)[R][M]) {
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const bf16* xs = x + m * x_stride + column + u * 512;
      const uint4 low = __ldg(reinterpret_cast<const uint4*>(xs)), high = __ldg(reinterpret_cast<const uint4*>(xs + 8));
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r][m] += dot16_fp8(w[r][u], low, high);
    }
}

template <int U, int R>
__device__ __forceinline__ void load_fp8_chunks(const uint8_t* const (&rows)[R], int column, uint4 (&w)[R][U]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int u = 0; u < U; ++u) w[r][u] = load_streaming_bytes(rows[r] + column + u * 512);
}

// acc[r][m] = x[m] . rows[r] (this lane's part), U 16-byte chunks of each row in
// flight per lane. The first chunks are loaded before the programmatic wait (the
// weights do not depend on the previous kernel). Returns valid, after the wait.
template <int M, int U, int R>
__device__ __forceinline__ bool fp8_row_dots(const bf16* x, int x_stride, const uint8_t* const (&rows)[R], bool valid,
                                             int k, int lane, float (&acc)[R][M]) {
  int column = lane * 16;
  bool full = valid && column + (U - 1) * 512 < k;
  uint4 chunk[R][U];
  if (full) load_fp8_chunks<U, R>(rows, column, chunk);
  pdl_wait();
  pdl_trigger();
  if (!valid) return false;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  while (full) {
    accumulate_fp8<M, U, R>(x, x_stride, column, chunk, acc);
    column += U * 512;
    full = column + (U - 1) * 512 < k;
    if (full) load_fp8_chunks<U, R>(rows, column, chunk);
  }
  for (; column < k; column += 512) {
    uint4 tail[R][1];
#pragma unroll
    for (int r = 0; r < R; ++r) tail[r][0] = load_streaming_bytes(rows[r] + column);
    accumulate_fp8<M, 1, R>(x, x_stride, column, tail, acc);
  }
  return true;
}

// A warp takes R consecutive rows, W warps a CTA.
template <int M, int U, int R, int W>
__global__ void __launch_bounds__(W * 32)
    skinny_gemm_fp8_kernel(const bf16* x, int x_stride, const uint8_t* w, const float* w_scale, int n, int k, void* y,
                           int y_stride, bool y_is_bf16) {
  const int lane = threadIdx.x % 32;
  const int first = (blockIdx.x * W + threadIdx.x / 32) * R;
  const uint8_t* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = w + static_cast<int64_t>(first + r < n ? first + r : 0) * k;
  float acc[R][M];
  if (!fp8_row_dots<M, U, R>(x, x_stride, rows, first < n, k, lane, acc)) return;
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (first + r < n) store_row<M>(acc[r], w_scale[first + r], lane, first + r, y, y_stride, y_is_bf16);
}

// out[m, i] = silu(g) * u over FP8 weights: a warp takes gate row i and up row
// intermediate + i, with the unfused path's roundings (each scaled sum to bf16,
// then SwiGLU).
template <int M, int U, int W>
__global__ void __launch_bounds__(W * 32)
    skinny_gate_up_fp8_kernel(const bf16* x, int x_stride, const uint8_t* w, const float* w_scale, int intermediate,
                              int k, bf16* out) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * W + threadIdx.x / 32;
  const int safe = row < intermediate ? row : 0;
  const uint8_t* rows[2] = {w + static_cast<int64_t>(safe) * k, w + static_cast<int64_t>(intermediate + safe) * k};
  float acc[2][M];
  if (!fp8_row_dots<M, U, 2>(x, x_stride, rows, row < intermediate, k, lane, acc)) return;
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float g16 = __bfloat162float(__float2bfloat16_rn(warp_sum(acc[0][m]) * w_scale[row]));
    const float u16 = __bfloat162float(__float2bfloat16_rn(warp_sum(acc[1][m]) * w_scale[intermediate + row]));
    if (lane == 0) out[static_cast<int64_t>(m) * intermediate + row] = __float2bfloat16_rn(g16 / (1.0f + __expf(-g16)) * u16);
  }
}

void check_aligned(const void* x, int x_stride, int k) {
  if (k % 8 != 0 || x_stride % 8 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0)
    throw_unsupported("cuda skinny GEMM: k and the row stride must be multiples of 8", k);
}

}  // namespace

void launch_skinny_gemm(const bf16* x, int32_t m, int32_t x_stride, const bf16* w, int32_t n, int32_t k, void* y,
                        bool y_is_bf16, int32_t y_stride, Launch launch) {
  check_aligned(x, x_stride, k);
  const int blocks = (n + kWarpsPerCta - 1) / kWarpsPerCta;
  switch (m) {
    case 1: launch_kernel(launch, blocks, kWarpsPerCta * 32, 0, skinny_gemm_kernel<1>, x, x_stride, w, n, k, y, y_stride, y_is_bf16); break;
    case 2: launch_kernel(launch, blocks, kWarpsPerCta * 32, 0, skinny_gemm_kernel<2>, x, x_stride, w, n, k, y, y_stride, y_is_bf16); break;
    case 3: launch_kernel(launch, blocks, kWarpsPerCta * 32, 0, skinny_gemm_kernel<3>, x, x_stride, w, n, k, y, y_stride, y_is_bf16); break;
    case 4: launch_kernel(launch, blocks, kWarpsPerCta * 32, 0, skinny_gemm_kernel<4>, x, x_stride, w, n, k, y, y_stride, y_is_bf16); break;
    default: throw_unsupported("cuda skinny GEMM: rows (1..4)", m);
  }
}

void launch_skinny_gemm_fp8(const bf16* x, int32_t m, int32_t x_stride, const uint8_t* w, const float* w_scale,
                            int32_t n, int32_t k, void* y, bool y_is_bf16, int32_t y_stride, Launch launch) {
  check_aligned(x, x_stride, k);
  if (k % 16 != 0) throw_unsupported("cuda FP8 skinny GEMM: k must be a multiple of 16", k);
  constexpr int U = kFp8Unroll, R = kFp8RowsPerWarp, W = kWarpsPerCta;
  const int blocks = (n + W * R - 1) / (W * R);
  switch (m) {
    case 1: launch_kernel(launch, blocks, W * 32, 0, skinny_gemm_fp8_kernel<1, U, R, W>, x, x_stride, w, w_scale, n, k, y, y_stride, y_is_bf16); break;
    case 2: launch_kernel(launch, blocks, W * 32, 0, skinny_gemm_fp8_kernel<2, U, R, W>, x, x_stride, w, w_scale, n, k, y, y_stride, y_is_bf16); break;
    case 3: launch_kernel(launch, blocks, W * 32, 0, skinny_gemm_fp8_kernel<3, U, R, W>, x, x_stride, w, w_scale, n, k, y, y_stride, y_is_bf16); break;
    case 4: launch_kernel(launch, blocks, W * 32, 0, skinny_gemm_fp8_kernel<4, U, R, W>, x, x_stride, w, w_scale, n, k, y, y_stride, y_is_bf16); break;
    default: throw_unsupported("cuda skinny GEMM: rows (1..4)", m);
  }
}

void launch_skinny_gate_up_swiglu_fp8(const bf16* x, int32_t m, int32_t x_stride, const uint8_t* w, const float* w_scale,
                                      int32_t intermediate, int32_t k, bf16* out, Launch launch) {
  check_aligned(x, x_stride, k);
  if (k % 16 != 0) throw_unsupported("cuda FP8 skinny GEMM: k must be a multiple of 16", k);
  constexpr int U = kFp8Unroll, W = kWarpsPerCta;
  const int blocks = (intermediate + W - 1) / W;
  switch (m) {
    case 1: launch_kernel(launch, blocks, W * 32, 0, skinny_gate_up_fp8_kernel<1, U, W>, x, x_stride, w, w_scale, intermediate, k, out); break;
    case 2: launch_kernel(launch, blocks, W * 32, 0, skinny_gate_up_fp8_kernel<2, U, W>, x, x_stride, w, w_scale, intermediate, k, out); break;
    case 3: launch_kernel(launch, blocks, W * 32, 0, skinny_gate_up_fp8_kernel<3, U, W>, x, x_stride, w, w_scale, intermediate, k, out); break;
    case 4: launch_kernel(launch, blocks, W * 32, 0, skinny_gate_up_fp8_kernel<4, U, W>, x, x_stride, w, w_scale, intermediate, k, out); break;
    default: throw_unsupported("cuda skinny GEMM: rows (1..4)", m);
  }
}

void launch_skinny_gate_up_swiglu(const bf16* x, int32_t m, int32_t x_stride, const bf16* w, int32_t intermediate,
                                  int32_t k, bf16* out, Launch launch) {
  check_aligned(x, x_stride, k);
  const int blocks = (intermediate + kWarpsPerCta - 1) / kWarpsPerCta;
  switch (m) {
    case 1: launch_kernel(launch, blocks, kWarpsPerCta * 32, 0, skinny_gate_up_kernel<1>, x, x_stride, w, intermediate, k, out); break;
    case 2: launch_kernel(launch, blocks, kWarpsPerCta * 32, 0, skinny_gate_up_kernel<2>, x, x_stride, w, intermediate, k, out); break;
    case 3: launch_kernel(launch, blocks, kWarpsPerCta * 32, 0, skinny_gate_up_kernel<3>, x, x_stride, w, intermediate, k, out); break;
    case 4: launch_kernel(launch, blocks, kWarpsPerCta * 32, 0, skinny_gate_up_kernel<4>, x, x_stride, w, intermediate, k, out); break;
    default: throw_unsupported("cuda skinny GEMM: rows (1..4)", m);
  }
}

#ifdef LOOM_CUDA_MEASURE
void launch_skinny_gemm_variant(const bf16* x, int32_t k, const bf16* w, int32_t n, float* y, int32_t unroll,
                                int32_t warps, cudaStream_t stream) {
  check_aligned(x, k, k);
  auto go = [&](auto kernel, int w_per_cta) {
    launch_kernel(Launch(stream), (n + w_per_cta - 1) / w_per_cta, w_per_cta * 32, 0, kernel, x, k, w, n, k,
                  static_cast<void*>(y), n, false);
  };
  switch (unroll * 100 + warps) {
    case 204: go(skinny_gemm_kernel<1, 2, 4>, 4); break;
    case 402: go(skinny_gemm_kernel<1, 4, 2>, 2); break;
    case 404: go(skinny_gemm_kernel<1, 4, 4>, 4); break;
    case 408: go(skinny_gemm_kernel<1, 4, 8>, 8); break;
    case 804: go(skinny_gemm_kernel<1, 8, 4>, 4); break;
    case 808: go(skinny_gemm_kernel<1, 8, 8>, 8); break;
    case 1604: go(skinny_gemm_kernel<1, 16, 4>, 4); break;
    default: throw_unsupported("skinny GEMM variant (unroll * 100 + warps)", unroll * 100 + warps);
  }
}

void launch_skinny_gemm_fp8_variant(const bf16* x, int32_t k, const uint8_t* w, const float* w_scale, int32_t n,
                                    float* y, int32_t unroll, int32_t rows_per_warp, int32_t warps, cudaStream_t stream) {
  check_aligned(x, k, k);
  auto go = [&](auto kernel, int w_per_cta, int r) {
    launch_kernel(Launch(stream), (n + w_per_cta * r - 1) / (w_per_cta * r), w_per_cta * 32, 0, kernel, x, k, w,
                  w_scale, n, k, static_cast<void*>(y), n, false);
  };
  switch (unroll * 10000 + rows_per_warp * 100 + warps) {
    case 80104: go(skinny_gemm_fp8_kernel<1, 8, 1, 4>, 4, 1); break;
    case 40204: go(skinny_gemm_fp8_kernel<1, 4, 2, 4>, 4, 2); break;
    case 80204: go(skinny_gemm_fp8_kernel<1, 8, 2, 4>, 4, 2); break;
    case 40404: go(skinny_gemm_fp8_kernel<1, 4, 4, 4>, 4, 4); break;
    case 20404: go(skinny_gemm_fp8_kernel<1, 2, 4, 4>, 4, 4); break;
    case 40208: go(skinny_gemm_fp8_kernel<1, 4, 2, 8>, 8, 2); break;
    case 20204: go(skinny_gemm_fp8_kernel<1, 2, 2, 4>, 4, 2); break;
    case 160104: go(skinny_gemm_fp8_kernel<1, 16, 1, 4>, 4, 1); break;
    default: throw_unsupported("FP8 skinny GEMM variant (unroll * 10000 + rows * 100 + warps)",
                               unroll * 10000 + rows_per_warp * 100 + warps);
  }
}

namespace {

__global__ void read_probe_kernel(const uint4* data, int64_t count, uint32_t* sink) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = load_streaming(reinterpret_cast<const bf16*>(data + i));
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // keeps the loads
}

}  // namespace

void launch_read_probe(const void* data, int64_t bytes, uint32_t* sink, int32_t blocks, int32_t threads,
                       cudaStream_t stream) {
  read_probe_kernel<<<blocks, threads, 0, stream>>>(static_cast<const uint4*>(data), bytes / 16, sink);
  LOOM_CUDA_CHECK_LAUNCH();
}

#endif  // LOOM_CUDA_MEASURE

}  // namespace loom::cuda
