// What the two wide prefill kernels (attention_wide.cu, attention_pingpong.cu)
// share: a kPrefillWide item's 128 rows of (token, query head) for one kv
// head, two warpgroups of 64 rows, 128-key tiles, S = Q K^T and O = P V on
// wgmma (wgmma.cuh's layouts). Q's gather into shared memory, each thread's row
// limits, the softmax of one S tile, P's packing into PV's A fragments, and the
// epilogue. Masking and row numbering are attention.cu's: row (token i) sees key
// j iff j < kv_end and j <= num_computed + i; decoder rows (base sharing) are
// queries after the new tokens.
#pragma once

#include <cfloat>
#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/wgmma.cuh"

namespace loom::cuda {

inline constexpr int kWideTileKeys = 128;  // keys per tile: S is m64n128 per warpgroup

// The dynamic shared memory from its first 1024-byte boundary (the 128-byte
// swizzle's atoms start there): shared-space address and generic pointer.
struct WideShared {
  uint32_t address;
  unsigned char* pointer;
};

__device__ __forceinline__ WideShared wide_shared_base(unsigned char* raw) {
  const uint32_t raw_address = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
  const uint32_t address = (raw_address + 1023u) & ~1023u;
  return {address, raw + (address - raw_address)};
}

// Issues (does not commit) the cp.async copies of the item's Q rows into
// 128-byte-swizzled shared memory at `q_shared`; `threads` threads from `tid`.
template <int kHeadDim>
__device__ __forceinline__ void wide_load_q(const AttentionParams& p, const AttentionWorkItem& item,
                                            const AttentionSequence& sequence, int kv_head, int group,
                                            int total_rows, int tid, int threads, unsigned char* q_shared) {
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks a row
  const int q_size = p.num_heads * kHeadDim;
  for (int chunk = tid; chunk < kAttentionWideRows * kChunks; chunk += threads) {
    const int r = chunk / kChunks;
    const int c = chunk % kChunks;
    const int row = item.row_begin + r;
    const bool valid = row < total_rows;
    const bf16* source = p.q;
    if (valid) source += sequence.query_row(row / group) * q_size + (kv_head * group + row % group) * kHeadDim + c * 8;
    cp_async_16(q_shared + swizzled_chunk_offset(r, c, kAttentionWideRows), source, valid);
  }
}

// The exclusive key limit of each of the thread's two rows (0 for padding
// rows), and the furthest of its warpgroup's rows: tiles at or past that one
// are skipped.
struct WideRowLimits {
  int row[2];
  int warpgroup;
};

__device__ __forceinline__ WideRowLimits wide_row_limits(const AttentionSequence& sequence,
                                                         const AttentionWorkItem& item, int group, int total_rows,
                                                         int warpgroup, int warp, int g) {
  WideRowLimits limits;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = item.row_begin + warpgroup * 64 + warp * 16 + g + 8 * h;
    const int causal = row < total_rows ? sequence.num_computed_tokens + sequence.query_token(row / group) + 1 : 0;
    limits.row[h] = min(causal, item.kv_end);
  }
  limits.warpgroup = 0;
  const int first_row = item.row_begin + warpgroup * 64;
  const int last_row = min(first_row + 63, total_rows - 1);
  for (int q = first_row / group; first_row <= last_row && q <= last_row / group; ++q)
    limits.warpgroup = max(limits.warpgroup, sequence.num_computed_tokens + sequence.query_token(q) + 1);
  limits.warpgroup = min(limits.warpgroup, item.kv_end);
  return limits;
}

// One S tile (the warpgroup's 64 rows x 128 keys from tile_start, wgmma's D
// layout) in place: masked past each row's limit, exponentiated in the log2
// domain against the running max. rescale multiplies what was accumulated
// before the tile, tile_sum is the tile's share of the row sums. The max is
// taken on the raw scores (scale > 0) so that scaling and shifting are one
// FFMA an element: the ping-pong kernel is issue-bound (ncu, H100).
__device__ __forceinline__ void wide_softmax_tile(float (&s)[64], int tile_start, const int (&row_limit)[2],
                                                  int min_row_limit, float scale_log2, int quad, float (&row_max)[2],
                                                  float (&rescale)[2], float (&tile_sum)[2]) {
  // Four partial maxima and sums a row (c = (i / 4) % 4): four dependency
  // chains of 8 instead of one of 32, since the other warpgroup's GEMMs last
  // only as long as this softmax's critical path may.
  float part[2][4];
#pragma unroll
  for (int c = 0; c < 4; ++c) part[0][c] = part[1][c] = -INFINITY;
  if (tile_start + kWideTileKeys > min_row_limit) {
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int h = (i % 4) / 2;
      const int key = tile_start + (i / 4) * 8 + 2 * quad + (i % 2);
      if (key >= row_limit[h]) s[i] = -INFINITY;
      part[h][(i / 4) % 4] = fmaxf(part[h][(i / 4) % 4], s[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 64; ++i) part[(i % 4) / 2][(i / 4) % 4] = fmaxf(part[(i % 4) / 2][(i / 4) % 4], s[i]);
  }
  float tile_max[2];
#pragma unroll
  for (int h = 0; h < 2; ++h)
    tile_max[h] = fmaxf(fmaxf(part[h][0], part[h][1]), fmaxf(part[h][2], part[h][3])) * scale_log2;
  float shift[2];
  online_max_update(tile_max, row_max, shift, rescale);
#pragma unroll
  for (int c = 0; c < 4; ++c) part[0][c] = part[1][c] = 0.0f;
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const int h = (i % 4) / 2;
    s[i] = exp2_ftz(fmaf(s[i], scale_log2, -shift[h]));
    part[h][(i / 4) % 4] += s[i];
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) tile_sum[h] = (part[h][0] + part[h][1]) + (part[h][2] + part[h][3]);
}

// S = Q K^T for the warpgroup's 64 rows of Q (at q_address) against the
// 128-key K tile at k_tile, both swizzled in shared memory: issued and
// committed, not waited for.
template <int kHeadDim>
__device__ __forceinline__ void wide_issue_qk(float (&s)[64], uint32_t q_address, uint32_t k_tile, int warpgroup) {
  fence_accumulators(s);
  const uint64_t q_base = smem_descriptor(q_address + warpgroup * 64 * 128, 16, 1024);
  const uint64_t k_base = smem_descriptor(k_tile, 16, 1024);
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < kHeadDim / 16; ++k) {
    const uint32_t column = static_cast<uint32_t>(k % 4) * 32u;  // 16 columns into the 64-column block
    const uint64_t desc_q = smem_descriptor_at(q_base, (k / 4) * kAttentionWideRows * 128 + column);
    const uint64_t desc_k = smem_descriptor_at(k_base, (k / 4) * kWideTileKeys * 128 + column);
    wgmma_m64n128k16_ss(s, desc_q, desc_k, k > 0 ? 1 : 0);
  }
  wgmma_commit();
}

// After a tile's softmax: the row sums and what O accumulated before the tile
// rescaled to the new max, plus the tile's sums.
template <int kOut>
__device__ __forceinline__ void wide_rescale(float (&o)[kOut], float (&row_sum)[2], const float (&rescale)[2],
                                             const float (&tile_sum)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) row_sum[h] = row_sum[h] * rescale[h] + tile_sum[h];
  // Once the running max settles (most tiles past the first few), every
  // rescale is exactly 1: the warp skips its multiplies (same bits either way).
  if (__any_sync(0xffffffffu, rescale[0] != 1.0f || rescale[1] != 1.0f)) {
#pragma unroll
    for (int i = 0; i < kOut; ++i) o[i] *= rescale[(i % 4) / 2];
  }
}

// P (the exponentiated S accumulators) packed to bf16: exactly PV's A fragments.
__device__ __forceinline__ void pack_probabilities(const float (&s)[64], uint32_t (&a)[kWideTileKeys / 16][4]) {
#pragma unroll
  for (int k = 0; k < kWideTileKeys / 16; ++k) {
    a[k][0] = pack_bf16(s[8 * k + 0], s[8 * k + 1]);
    a[k][1] = pack_bf16(s[8 * k + 2], s[8 * k + 3]);
    a[k][2] = pack_bf16(s[8 * k + 4], s[8 * k + 5]);
    a[k][3] = pack_bf16(s[8 * k + 6], s[8 * k + 7]);
  }
}

// O += P V for one 16-key step, V MN-major in shared memory.
template <int kHeadDim>
__device__ __forceinline__ void wgmma_pv(float (&o)[kHeadDim / 2], const uint32_t (&a)[4], uint64_t desc_b) {
  if constexpr (kHeadDim == 128) {
    wgmma_m64n128k16_rs_mn(o, a, desc_b);
  } else {
    wgmma_m64n64k16_rs_mn(o, a, desc_b);
  }
}

// O += P V over the 128-key V tile at v_tile (MN-major in shared memory), P
// from pack_probabilities: issued and committed, not waited for.
template <int kHeadDim>
__device__ __forceinline__ void wide_issue_pv(float (&o)[kHeadDim / 2], const uint32_t (&a)[kWideTileKeys / 16][4],
                                              uint32_t v_tile) {
  fence_accumulators(o);
  const uint64_t v_base = smem_descriptor(v_tile, kWideTileKeys * 128, 1024);
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < kWideTileKeys / 16; ++k) wgmma_pv<kHeadDim>(o, a[k], smem_descriptor_at(v_base, k * 2048));
  wgmma_commit();
}

// The epilogue: each row's O over its quad-reduced sum, to p.out as bf16.
template <int kHeadDim>
__device__ __forceinline__ void wide_store_rows(const AttentionParams& p, const AttentionWorkItem& item,
                                                const AttentionSequence& sequence, int kv_head, int group,
                                                int total_rows, int warpgroup, int warp, int g, int quad,
                                                const float (&o)[kHeadDim / 2], float (&row_sum)[2]) {
  const int q_size = p.num_heads * kHeadDim;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = item.row_begin + warpgroup * 64 + warp * 16 + g + 8 * h;
    if (row >= total_rows) continue;
    const float inverse = row_sum[h] > 0.0f ? 1.0f / row_sum[h] : 0.0f;
    const int64_t token = sequence.query_row(row / group);
    bf16* out = p.out + token * q_size + (kv_head * group + row % group) * kHeadDim;
#pragma unroll
    for (int c = 0; c < kHeadDim / 8; ++c)
      *reinterpret_cast<__nv_bfloat162*>(out + c * 8 + 2 * quad) =
          __floats2bfloat162_rn(o[4 * c + 2 * h] * inverse, o[4 * c + 2 * h + 1] * inverse);
  }
}

}  // namespace loom::cuda
