// An FP8 (e4m3) KV cache (--kv-cache-dtype fp8): what the kernels that write
// and read the main pool do with its bytes. An entry holds e4m3(x / scale),
// rounded to nearest, saturated at +-448 (vLLM's and FlashInfer's fp8_e4m3
// cache); a reader gets bf16(e4m3 * scale), so from there every attention
// kernel runs its bf16 path unchanged. The scale is per layer and per K / V
// (KvFp8Scales); 1.0 unless a checkpoint gives one, as in vLLM.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp8.h>

namespace loom::cuda {

__device__ __forceinline__ uint8_t kv_fp8_encode(float value, float scale) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(__fdiv_rn(value, scale), __NV_SATFINITE, __NV_E4M3));
}

// Eight consecutive e4m3 entries (8 bytes, 8-byte aligned) as eight bf16 values times `scale`.
__device__ __forceinline__ uint4 kv_fp8_decode8(uint2 bits, float scale) {
  uint4 out;
  uint32_t* words = reinterpret_cast<uint32_t*>(&out);
  const uint32_t in[2] = {bits.x, bits.y};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>(in[i / 2] >> (16 * (i % 2)));
    const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);  // exact: e4m3 is a subset of fp16
    const float2 value = __half22float2(__half2(raw));
    const __nv_bfloat162 scaled = __floats2bfloat162_rn(value.x * scale, value.y * scale);
    words[i] = *reinterpret_cast<const uint32_t*>(&scaled);
  }
  return out;
}

// Eight e4m3 entries (8 bytes, 8-byte aligned) from global memory; zeros where
// not `valid` (the source is not read). The load is in flight until the bits are
// used: a kernel fetches its next tile here before the current tile's math and
// stores it (kv_fp8_store8) after, which hides the latency as cp.async does for bf16.
__device__ __forceinline__ uint2 kv_fp8_fetch8(const uint8_t* global, bool valid) {
  return valid ? __ldg(reinterpret_cast<const uint2*>(global)) : make_uint2(0u, 0u);
}

// Fetched entries to shared memory as eight bf16 values times `scale` (16 bytes,
// a plain store: the caller's barrier publishes it).
__device__ __forceinline__ void kv_fp8_store8(void* shared, uint2 bits, float scale) {
  *reinterpret_cast<uint4*>(shared) = kv_fp8_decode8(bits, scale);
}

// Fetch and store at once (the first tile, and loaders that have nothing to overlap).
__device__ __forceinline__ void kv_fp8_load8(void* shared, const uint8_t* global, bool valid, float scale) {
  kv_fp8_store8(shared, kv_fp8_fetch8(global, valid), scale);
}

__device__ __forceinline__ float kv_fp8_decode(uint8_t bits, float scale) {
  const __half_raw raw = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(bits), __NV_E4M3);
  return __half2float(__half(raw)) * scale;
}

}  // namespace loom::cuda
