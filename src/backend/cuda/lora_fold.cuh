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

// Block-cooperative sums over v's chunk partials: for each of `items` items,
// store(item, sum over split < splits of first(item)[split * split_stride]).
// A power-of-two group of lanes shares each item (as many as the block has
// threads for, at most a warp), each lane a strided share of the chunks, the
// group reduced by shuffles: the chunks' loads are in flight at once. Fixed
// order: deterministic. Every thread of the block must call it (uniform
// arguments); the caller synchronizes before reading what store() wrote.
template <typename First, typename Store>
__device__ __forceinline__ void lora_split_sums(int items, int splits, int64_t split_stride, First first, Store store) {
  if (items <= 0) return;
  int group = 1;
  while (group < 32 && 2 * group * items <= static_cast<int>(blockDim.x)) group *= 2;
  for (int base = 0; base < items * group; base += blockDim.x) {
    const int t = base + threadIdx.x;
    const int item = t / group, part = t % group;
    float sum = 0.0f;
    if (item < items) {
      const float* v = first(item);
      for (int split = part; split < splits; split += group) sum += v[split * split_stride];
    }
    for (int offset = group / 2; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (part == 0 && item < items) store(item, sum);
  }
}

// out[j] = scale * (the sum of v's chunk partials of `lora_row`, target `index`)
// for j < rank, as lora_split_sums (every thread calls; the caller synchronizes).
__device__ __forceinline__ void lora_fold_gather(const LoraFold& fold, int index, int64_t lora_row, int rank,
                                                 float scale, float* out) {
  const int64_t split_stride = static_cast<int64_t>(fold.num_rows) * fold.max_rank;
  const float* v = fold.v + static_cast<int64_t>(index) * fold.max_splits * split_stride + lora_row * fold.max_rank;
  lora_split_sums(
      rank, fold.splits, split_stride, [&](int j) { return v + j; }, [&](int j, float sum) { out[j] = scale * sum; });
}

__device__ __forceinline__ float lora_dot8(const float* v, const uint4& packed) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 pair = __bfloat1622float2(pairs[k]);
    sum += v[2 * k] * pair.x + v[2 * k + 1] * pair.y;
  }
  return sum;
}

// v . B[o] over the module's rank. The first 16 ranks are unrolled (predicated),
// so a caller's several columns put all their loads in flight at once.
__device__ __forceinline__ float lora_fold_dot(const float* v, const __nv_bfloat16* b, int64_t o, int rank) {
  const __nv_bfloat16* row = b + o * rank;
  float sum = 0.0f;
  if (rank % 8 == 0) {  // rows are 16-byte aligned then
#pragma unroll
    for (int j = 0; j < 16; j += 8)
      if (j < rank) sum += lora_dot8(v + j, __ldg(reinterpret_cast<const uint4*>(row + j)));
    for (int j = 16; j < rank; j += 8) sum += lora_dot8(v + j, __ldg(reinterpret_cast<const uint4*>(row + j)));
  } else {
    for (int j = 0; j < rank; ++j) sum += v[j] * __bfloat162float(row[j]);
  }
  return sum;
}

// B rows of up to kColumns columns, ranks 0..15, loaded before v is gathered
// (their loads overlap the gather's): for modules of rank 8 or 16, `valid`;
// dot(c) then equals lora_fold_dot of the c-th column loaded.
template <int kColumns>
struct LoraRowsAhead {
  uint4 rows[kColumns][2];
  bool valid = false;
  __device__ __forceinline__ void start(int rank) { valid = rank == 8 || rank == 16; }
  __device__ __forceinline__ void load(int c, const __nv_bfloat16* b, int64_t column, int rank) {
    if (!valid) return;
    const __nv_bfloat16* row = b + column * rank;
    rows[c][0] = __ldg(reinterpret_cast<const uint4*>(row));
    rows[c][1] = rank > 8 ? __ldg(reinterpret_cast<const uint4*>(row + 8)) : make_uint4(0, 0, 0, 0);
  }
  __device__ __forceinline__ float dot(const float* v, int c, int rank) const {
    float sum = lora_dot8(v, rows[c][0]);
    if (rank > 8) sum += lora_dot8(v + 8, rows[c][1]);
    return sum;
  }
};

}  // namespace loom::cuda
