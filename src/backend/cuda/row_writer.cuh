// The attention kernels' output rows: a work item's finished (row, head dim)
// values go to the output, or, for a split-KV item, to its partial slot with the
// row's log-sum-exp for the combine kernel (attention.cu, residual_decode.cu).
#pragma once

#include <cuda_bf16.h>

#include "backend/cuda/kernels.h"

namespace loom::cuda {

// Writes one finished row value pair (columns d, d + 1) to the output or the partial buffer.
struct RowWriter {
  const AttentionParams& p;
  const AttentionWorkItem& item;
  int kv_head, group;
  const AttentionSequence& sequence;

  __device__ void write(int local_row, int d, float v0, float v1) const {
    const int row = item.row_begin + local_row;
    if (item.partial_index >= 0) {
      float* destination = p.partial_out +
                           ((static_cast<int64_t>(item.partial_index) * p.num_kv_heads + kv_head) * kAttentionMaxRows +
                            local_row) * p.head_dim + d;
      destination[0] = v0;
      destination[1] = v1;
      return;
    }
    const int64_t token = sequence.query_row(row / group);
    const int head = kv_head * group + row % group;
    *reinterpret_cast<__nv_bfloat162*>(p.out + token * p.num_heads * p.head_dim + head * p.head_dim + d) =
        __floats2bfloat162_rn(v0, v1);
  }
  __device__ void write_lse(int local_row, float lse) const {
    if (item.partial_index < 0) return;
    p.partial_lse[(static_cast<int64_t>(item.partial_index) * p.num_kv_heads + kv_head) * kAttentionMaxRows +
                  local_row] = lse;
  }
};

}  // namespace loom::cuda
