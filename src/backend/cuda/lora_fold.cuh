// Device side of a folded LoRA group (kernels.h's LoraFold): the consuming
// kernel gathers its row's v once into shared memory (scale applied), then adds
// v . B[o] to each column o it touches. B rows are [rank] bf16, contiguous.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "backend/cuda/kernels.h"

namespace loom::cuda {

// The module of v's target `index` for the row's adapter slot (rank 0: not targeted).
__device__ __forceinline__ LoraModuleRef lora_fold_module(const LoraFold& fold, int adapter_slot, int index) {
  return lora_module(fold.modules, adapter_slot, fold.num_layers, fold.layer, fold.first_target + index);
}

// Block-cooperative: out[j] = scale * (sum of v's chunk partials of `lora_row`,
// target `index`) for j < rank. The caller synchronizes before reading out.
__device__ __forceinline__ void lora_fold_gather(const LoraFold& fold, int index, int64_t lora_row, int rank,
                                                 float scale, float* out) {
  const int64_t split_stride = static_cast<int64_t>(fold.num_rows) * fold.max_rank;
  for (int j = threadIdx.x; j < rank; j += blockDim.x) {
    const float* v = fold.v + static_cast<int64_t>(index) * fold.max_splits * split_stride + lora_row * fold.max_rank + j;
    float sum = 0.0f;
#pragma unroll 4
    for (int split = 0; split < fold.splits; ++split) sum += v[split * split_stride];
    out[j] = scale * sum;
  }
}

// v . B[o] over the module's rank.
__device__ __forceinline__ float lora_fold_dot(const float* v, const __nv_bfloat16* b, int64_t o, int rank) {
  const __nv_bfloat16* row = b + o * rank;
  float sum = 0.0f;
  if (rank % 8 == 0) {  // rows are 16-byte aligned then
    for (int j = 0; j < rank; j += 8) {
      const uint4 packed = __ldg(reinterpret_cast<const uint4*>(row + j));
      const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 pair = __bfloat1622float2(pairs[k]);
        sum += v[j + 2 * k] * pair.x + v[j + 2 * k + 1] * pair.y;
      }
    }
  } else {
    for (int j = 0; j < rank; ++j) sum += v[j] * __bfloat162float(row[j]);
  }
  return sum;
}

}  // namespace loom::cuda
