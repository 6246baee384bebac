// Device-side building blocks of the tensor-core kernels (attention.cu,
// residual_keys.cuh): cp.async copies into shared memory, ldmatrix fragment
// loads, the m16n8k16 bf16 MMA (fp32 accumulate) and the online softmax's
// running-max step. Fragment layouts are
// PTX's for mma.sync.aligned.m16n8k16.row.col: lane = 4 g + quad holds rows g
// and g + 8, columns 2 quad and 2 quad + 1 of each 8-column C tile.
#pragma once

#include <cmath>
#include <cstdint>

#include <cuda_bf16.h>

namespace loom::cuda {

// 16 bytes global -> shared (a shared-space address), asynchronous; !valid writes zeros instead.
__device__ __forceinline__ void cp_async_16(uint32_t shared_address, const void* global, bool valid) {
  const int source_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address), "l"(global), "r"(source_bytes));
}
// The same with the destination as a generic pointer into shared memory.
__device__ __forceinline__ void cp_async_16(void* shared, const void* global, bool valid) {
  cp_async_16(static_cast<uint32_t>(__cvta_generic_to_shared(shared)), global, valid);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* shared) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* shared) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

// 2^x as one MUFU.EX2: results below 2^-126 flush to zero (they are far below
// what a bf16 probability or a float row sum can hold). exp2f without
// --use_fast_math adds a denormal range check and two multiplies around it,
// three more instructions per score in issue-bound softmax loops.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Online softmax, per thread's two rows h (g and g + 8): reduces tile_max over
// the row's quad, advances row_max, and gives the shift for this tile's
// exponents (log2 domain) and the rescale of what was accumulated before it.
// A row with every score so far masked keeps shift 0, so it stays all zero.
__device__ __forceinline__ void online_max_update(float (&tile_max)[2], float (&row_max)[2], float (&shift)[2],
                                                  float (&rescale)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
    tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
    const float new_max = fmaxf(row_max[h], tile_max[h]);
    shift[h] = new_max == -INFINITY ? 0.0f : new_max;
    rescale[h] = exp2f(row_max[h] - shift[h]);
    row_max[h] = new_max;
  }
}

}  // namespace loom::cuda
