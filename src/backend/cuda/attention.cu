// Paged causal GQA attention on tensor cores (FlashAttention-2 style), for
// prefill and decode, with split-KV partials merged by a combine kernel.
//
// A CTA (128 threads) runs one work item for one kv head (blockIdx.y): up to
// 64 (prefill) or 16 (decode) rows of (token, query head) of one sequence
// against KV entries [kv_begin, kv_end), in tiles of 64 keys gathered through
// the block table with cp.async (double-buffered, zero-filled past the end).
// S = Q K^T and O += P V use mma.sync m16n8k16 (bf16 in, fp32 accumulate) with
// ldmatrix fragments; the softmax is online, in the log2 domain.
//   prefill: warp w owns rows [16w, 16w + 16) and all 64 keys of each tile.
//   decode:  every warp owns the 16 rows and keys [16w, 16w + 16) of each tile;
//            the four (m, l, O) are merged through shared memory at the end.
// Masking: row (token i) sees key j iff j < kv_end and j <= num_cached + i.
// Base sharing (ICaRus): a sequence's decoder rows are queries after its new
// tokens (AttentionSequence::query_row / query_token), so their heads share the
// K/V tiles of the token they pair with.
// ResidualAttention (forked, kRankPad > 0): the tiles also stream rK / rV of
// the rCache and the CTA holds its kv head's B_k / B_v rows; decode rebuilds
// its warp's keys in registers (add_residual_scores), prefill in the shared K
// tile (rebuild_keys); P·rV accumulates beside P·V and meets s_v B_v^T once at
// the end.
#include <cfloat>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernel_attributes.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_fp8.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/residual_keys.cuh"

namespace loom::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kTileKeys = kAttentionTileKeys;

// kRankPad > 0: ResidualAttention, with B_k / B_v slices [kHeadDim][kRankPad]
// and double-buffered rK / rV tiles [2][kTileKeys][kRankPad] (rows padded by 8).
template <int kHeadDim, int kRowWarps, int kRankPad>
constexpr size_t attention_shared_bytes() {
  constexpr int kStride = kHeadDim + 8;
  constexpr size_t kResidual = kRankPad > 0 ? static_cast<size_t>(2 * kHeadDim + 4 * kTileKeys) * (kRankPad + 8) : 0;
  constexpr size_t kRopeTable = kRankPad > 0 && kRowWarps == 1 ? (kHeadDim / 4) * (sizeof(float4) + sizeof(float2)) : 0;
  return (static_cast<size_t>(16 * kRowWarps + 4 * kTileKeys) * kStride + kResidual) * sizeof(bf16) + kRopeTable;
}

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

// kFp8: the main pool is an FP8 cache (AttentionParams::k_cache_fp8), decoded into the bf16 tiles as it is loaded.
template <int kHeadDim, int kRowWarps, int kRankPad, bool kFp8>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttentionParams p, const AttentionWorkItem* items) {
  pdl_wait();
  pdl_trigger();
  constexpr int kKeyWarps = 4 / kRowWarps;
  constexpr int kRows = 16 * kRowWarps;
  constexpr int kKeysPerWarp = kTileKeys / kKeyWarps;  // 64 or 16
  constexpr int kScoreTiles = kKeysPerWarp / 8;
  constexpr int kOutTiles = kHeadDim / 8;
  constexpr int kDimSteps = kHeadDim / 16;
  constexpr int kStride = kHeadDim + 8;  // +16 bytes a row: conflict-free ldmatrix
  constexpr int kChunksPerRow = kHeadDim / 8;

  extern __shared__ __align__(16) unsigned char shared_raw[];
  bf16* q_shared = reinterpret_cast<bf16*>(shared_raw);  // [kRows][kStride]
  bf16* k_shared = q_shared + kRows * kStride;            // [2][kTileKeys][kStride]
  bf16* v_shared = k_shared + 2 * kTileKeys * kStride;    // [2][kTileKeys][kStride]
  constexpr bool kForked = kRankPad > 0;
  constexpr int kRankStride = kRankPad + 8;
  constexpr int kRankSteps = kRankPad / 16;
  constexpr int kRankTiles = kRankPad / 8;
  bf16* bk_shared = v_shared + 2 * kTileKeys * kStride;    // [kHeadDim][kRankStride]: B_k rows of this kv head
  bf16* bv_shared = bk_shared + kHeadDim * kRankStride;    // [kHeadDim][kRankStride]
  bf16* rk_shared = bv_shared + kHeadDim * kRankStride;    // [2][kTileKeys][kRankStride]
  bf16* rv_shared = rk_shared + 2 * kTileKeys * kRankStride;
  float4* rope_shared = reinterpret_cast<float4*>(rv_shared + 2 * kTileKeys * kRankStride);  // decode: [kHeadDim / 4]
  float2* rope_sin_shared = reinterpret_cast<float2*>(rope_shared + kHeadDim / 4);

  const AttentionWorkItem item = items[blockIdx.x];
  if (item.sequence < 0) return;  // padding of a graph-captured step's list
  const int kv_head = blockIdx.y;
  const AttentionSequence sequence = p.sequences[item.sequence];
  const int group = p.num_heads / p.num_kv_heads;
  const int total_rows = sequence.num_queries() * group;
  const int q_size = p.num_heads * kHeadDim;
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int row_warp = warp % kRowWarps;
  const int key_warp = warp / kRowWarps;
  const int32_t* block_table = p.block_tables + sequence.block_table_offset;

  for (int chunk = tid; chunk < kRows * kChunksPerRow; chunk += kThreads) {
    const int r = chunk / kChunksPerRow;
    const int c = chunk % kChunksPerRow;
    const int row = item.row_begin + r;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (row < total_rows) {
      const int64_t token = sequence.query_row(row / group);
      const int head = kv_head * group + row % group;
      value = *reinterpret_cast<const uint4*>(p.q + token * q_size + head * kHeadDim + c * 8);
    }
    *reinterpret_cast<uint4*>(q_shared + r * kStride + c * 8) = value;
  }

  // ResidualAttention: this layer's k and v modules of the sequence's adapter.
  LoraModuleRef module_k{}, module_v{};
  const int32_t* residual_table = nullptr;
  if constexpr (kForked) {
    module_k = lora_module(p.lora_modules, sequence.forked_slot, p.num_layers, p.layer, kLoraTargetK);
    module_v = lora_module(p.lora_modules, sequence.forked_slot, p.num_layers, p.layer, kLoraTargetV);
    residual_table = p.residual_block_tables + sequence.residual_block_table_offset;
    // This kv head's rows of B_k and B_v, zero past the rank; 16-byte loads where the rows allow.
    auto load_b = [&](const LoraModuleRef& module, bf16* destination) {
      const int64_t first_row = static_cast<int64_t>(kv_head) * kHeadDim;
      if (module.rank % 8 == 0 && (reinterpret_cast<uintptr_t>(module.b) & 15) == 0) {
        constexpr int kChunks = kRankPad / 8;
        for (int index = tid; index < kHeadDim * kChunks; index += kThreads) {
          const int d = index / kChunks;
          const int c = index % kChunks;
          uint4 value = make_uint4(0, 0, 0, 0);
          if (c * 8 < module.rank)
            value = *reinterpret_cast<const uint4*>(module.b + (first_row + d) * module.rank + c * 8);
          *reinterpret_cast<uint4*>(destination + d * kRankStride + c * 8) = value;
        }
      } else {
        for (int index = tid; index < kHeadDim * kRankPad; index += kThreads) {
          const int d = index / kRankPad;
          const int j = index % kRankPad;
          destination[d * kRankStride + j] =
              j < module.rank ? module.b[(first_row + d) * module.rank + j] : __float2bfloat16_rn(0.0f);
        }
      }
    };
    load_b(module_k, bk_shared);
    load_b(module_v, bv_shared);
    if constexpr (kRowWarps == 1) {
      // RoPE of the warp's keys (decode_residual_scores): inv_freq, and the rotation by
      // 8 positions that takes a lane's key g to key g + 8.
      for (int pair = tid; pair < kHeadDim / 4; pair += kThreads) {
        const float f0 = p.inv_freq[2 * pair], f1 = p.inv_freq[2 * pair + 1];
        float c0, s0, c1, s1;
        sincosf(8.0f * f0, &s0, &c0);
        sincosf(8.0f * f1, &s1, &c1);
        rope_shared[pair] = make_float4(f0, f1, c0, c1);
        rope_sin_shared[pair] = make_float2(s0, s1);
      }
    }
  }

  // Thread tid copies chunk tid % kChunksPerRow of K/V rows tid / kChunksPerRow + kLoadRows * i
  // (rK / rV: the same with kRankChunks): one address computation per row, and all
  // block-table reads of a tile in flight together.
  constexpr int kLoadRows = kThreads / kChunksPerRow;
  constexpr int kLoadPasses = kTileKeys / kLoadRows;
  static_assert(kThreads % kChunksPerRow == 0 && kTileKeys % kLoadRows == 0, "whole rows per pass");
  const PagedGather kv_gather = PagedGather::kv(block_table, kv_head, p.block_size, p.num_kv_heads, kHeadDim);
  const int load_row = tid / kChunksPerRow;
  const int load_chunk = tid % kChunksPerRow;
  constexpr int kRankChunks = kForked ? kRankPad / 8 : 1;
  constexpr int kResidualLoadRows = kThreads / kRankChunks;
  constexpr int kResidualLoadPasses = kForked ? (kTileKeys + kResidualLoadRows - 1) / kResidualLoadRows : 0;
  const PagedGather residual_gather =
      PagedGather::rows(residual_table, p.residual_block_size, 2 * static_cast<int64_t>(p.residual_rank_stride));
  const int residual_load_row = tid / kRankChunks;
  const int residual_load_chunk = tid % kRankChunks;

  uint2 fetched_k[kFp8 ? kLoadPasses : 1], fetched_v[kFp8 ? kLoadPasses : 1];  // FP8: the next tile, in flight
  auto load_tile = [&](int tile_start, int buffer) {
    if constexpr (kForked) {
#pragma unroll
      for (int i = 0; i < kResidualLoadPasses; ++i) {
        const int r = residual_load_row + i * kResidualLoadRows;
        if (r >= kTileKeys) break;
        const int key = tile_start + r;
        const bool key_valid = key < item.kv_end;
        const bf16* source = p.residual_pool;
        if (key_valid) source += residual_gather.index(key) + residual_load_chunk * 8;
        const int destination = (buffer * kTileKeys + r) * kRankStride + residual_load_chunk * 8;
        // Zero-filled past the rank (the slot holds zeros there, but another adapter's rank may be smaller).
        cp_async_16(rk_shared + destination, source, key_valid && residual_load_chunk * 8 < module_k.rank);
        cp_async_16(rv_shared + destination, source + p.residual_rank_stride,
                    key_valid && residual_load_chunk * 8 < module_v.rank);
      }
    }
    int64_t offset[kLoadPasses];
    kv_gather.tile_offsets(tile_start, load_row, kLoadRows, item.kv_end, load_chunk * 8, offset);
#pragma unroll
    for (int i = 0; i < kLoadPasses; ++i) {
      const int r = load_row + i * kLoadRows;
      const bool valid = tile_start + r < item.kv_end;
      if constexpr (kFp8) {  // into registers; store_fetched puts them in `buffer` after this tile's math
        fetched_k[i] = kv_fp8_fetch8(p.k_cache_fp8 + offset[i], valid);
        fetched_v[i] = kv_fp8_fetch8(p.v_cache_fp8 + offset[i], valid);
      } else {
        const int destination = (buffer * kTileKeys + r) * kStride + load_chunk * 8;
        cp_async_16(k_shared + destination, p.k_cache + offset[i], valid);
        cp_async_16(v_shared + destination, p.v_cache + offset[i], valid);
      }
    }
    cp_async_commit();
  };
  // FP8: the fetched tile's entries, decoded into `buffer` (plain stores: the next barrier publishes them).
  auto store_fetched = [&](int buffer) {
#pragma unroll
    for (int i = 0; i < kLoadPasses; ++i) {
      const int destination = (buffer * kTileKeys + load_row + i * kLoadRows) * kStride + load_chunk * 8;
      kv_fp8_store8(k_shared + destination, fetched_k[i], p.k_scale);
      kv_fp8_store8(v_shared + destination, fetched_v[i], p.v_scale);
    }
  };

  const int num_tiles = (item.kv_end - item.kv_begin + kTileKeys - 1) / kTileKeys;
  load_tile(item.kv_begin, 0);
  if constexpr (kFp8) store_fetched(0);
  __syncthreads();  // q_shared written with plain stores

  uint32_t q_fragments[kDimSteps][4];
#pragma unroll
  for (int step = 0; step < kDimSteps; ++step)
    ldmatrix_x4(q_fragments[step], q_shared + (row_warp * 16 + lane % 16) * kStride + step * 16 + (lane / 16) * 8);

  const int g = lane / 4;
  const int quad = lane % 4;
  // Exclusive key limit per owned row (0 for padding rows: everything masked).
  int row_limit[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = item.row_begin + row_warp * 16 + g + 8 * h;
    const int causal = row < total_rows ? sequence.num_computed_tokens + sequence.query_token(row / group) + 1 : 0;
    row_limit[h] = causal < item.kv_end ? causal : item.kv_end;
  }
  const float scale_log2 = p.scale * 1.4426950408889634f;

  float out[kOutTiles][4];
#pragma unroll
  for (int t = 0; t < kOutTiles; ++t) out[t][0] = out[t][1] = out[t][2] = out[t][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};
  float out_residual[kForked ? kRankTiles : 1][4];  // P·rV
#pragma unroll
  for (int t = 0; t < (kForked ? kRankTiles : 1); ++t)
    out_residual[t][0] = out_residual[t][1] = out_residual[t][2] = out_residual[t][3] = 0.0f;

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int buffer = tile & 1;
    const int tile_start = item.kv_begin + tile * kTileKeys;
    if (tile + 1 < num_tiles) {
      load_tile(tile_start + kTileKeys, buffer ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if constexpr (kForked && kKeyWarps == 1) {  // prefill: every warp reads all 64 keys, rebuilt in shared memory
      if (module_k.rank > 0) {
        rebuild_keys<kHeadDim, kRankPad>(p.inv_freq, k_shared + buffer * kTileKeys * kStride,
                                         rk_shared + buffer * kTileKeys * kRankStride, bk_shared, module_k.scale,
                                         tile_start, item.kv_end, warp, lane);
        __syncthreads();
      }
    }

    const int first_key = tile_start + key_warp * kKeysPerWarp;
    const bf16* k_base = k_shared + (buffer * kTileKeys + key_warp * kKeysPerWarp) * kStride;
    float score[kScoreTiles][4];
#pragma unroll
    for (int t = 0; t < kScoreTiles; ++t) score[t][0] = score[t][1] = score[t][2] = score[t][3] = 0.0f;
    // Skip tiles this warp's rows cannot see (causal upper triangle).
    const bool any_visible = __any_sync(0xffffffffu, first_key < row_limit[0] || first_key < row_limit[1]);
    if (any_visible) {
#pragma unroll
      for (int step = 0; step < kDimSteps; ++step) {
#pragma unroll
        for (int t = 0; t < kScoreTiles; t += 2) {
          uint32_t b[4];
          ldmatrix_x4(b, k_base + (t * 8 + lane % 8 + (lane / 16) * 8) * kStride + step * 16 + ((lane / 8) % 2) * 8);
          mma_bf16(score[t], q_fragments[step], b[0], b[1]);
          mma_bf16(score[t + 1], q_fragments[step], b[2], b[3]);
        }
      }
      if constexpr (kForked && kKeyWarps > 1) {  // decode: the warp's 16 rebuilt keys stay in registers
        static_assert(kScoreTiles == 2, "decode warps own 16 keys");
        if (module_k.rank > 0)
          add_residual_scores<kHeadDim, kRankPad>(
              p.inv_freq, rope_shared, rope_sin_shared, score, q_fragments,
              rk_shared + (buffer * kTileKeys + key_warp * kKeysPerWarp) * kRankStride, bk_shared, module_k.scale,
              first_key, lane);
      }

      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int t = 0; t < kScoreTiles; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e / 2;
          const int key = first_key + t * 8 + 2 * quad + (e & 1);
          const float value = key < row_limit[h] ? score[t][e] * scale_log2 : -INFINITY;
          score[t][e] = value;
          tile_max[h] = fmaxf(tile_max[h], value);
        }
      }
      float rescale[2], shift[2];
      online_max_update(tile_max, row_max, shift, rescale);
      float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int t = 0; t < kScoreTiles; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int h = e / 2;
          score[t][e] = exp2_ftz(score[t][e] - shift[h]);
          tile_sum[h] += score[t][e];
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) row_sum[h] = row_sum[h] * rescale[h] + tile_sum[h];
#pragma unroll
      for (int t = 0; t < kOutTiles; ++t) {
        out[t][0] *= rescale[0];
        out[t][1] *= rescale[0];
        out[t][2] *= rescale[1];
        out[t][3] *= rescale[1];
      }
      if constexpr (kForked) {
#pragma unroll
        for (int t = 0; t < kRankTiles; ++t) {
          out_residual[t][0] *= rescale[0];
          out_residual[t][1] *= rescale[0];
          out_residual[t][2] *= rescale[1];
          out_residual[t][3] *= rescale[1];
        }
      }

      const bf16* v_base = v_shared + (buffer * kTileKeys + key_warp * kKeysPerWarp) * kStride;
#pragma unroll
      for (int step = 0; step < kKeysPerWarp / 16; ++step) {
        const uint32_t a[4] = {pack_bf16(score[2 * step][0], score[2 * step][1]),
                               pack_bf16(score[2 * step][2], score[2 * step][3]),
                               pack_bf16(score[2 * step + 1][0], score[2 * step + 1][1]),
                               pack_bf16(score[2 * step + 1][2], score[2 * step + 1][3])};
#pragma unroll
        for (int t = 0; t < kOutTiles; t += 2) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, v_base + (step * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kStride + t * 8 + (lane / 16) * 8);
          mma_bf16(out[t], a, b[0], b[1]);
          mma_bf16(out[t + 1], a, b[2], b[3]);
        }
        if constexpr (kForked) {
          if (module_v.rank > 0) {
            const bf16* rv_base = rv_shared + (buffer * kTileKeys + key_warp * kKeysPerWarp) * kRankStride;
#pragma unroll
            for (int t = 0; t < kRankTiles; t += 2) {
              uint32_t b[4];
              ldmatrix_x4_trans(b, rv_base + (step * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kRankStride + t * 8 +
                                       (lane / 16) * 8);
              mma_bf16(out_residual[t], a, b[0], b[1]);
              mma_bf16(out_residual[t + 1], a, b[2], b[3]);
            }
          }
        }
      }
    }
    if constexpr (kFp8) {
      if (tile + 1 < num_tiles) store_fetched(buffer ^ 1);  // read by no one since the last barrier
    }
    __syncthreads();  // everyone is done with `buffer` before it is refilled
  }
  if constexpr (kForked) {
    // V's up-projection, once: out += (P·rV) · s_v B_v^T (linear, so before any merge of partial sums).
    if (module_v.rank > 0) {
#pragma unroll
      for (int step = 0; step < kRankSteps; ++step) {
        const float scale = module_v.scale;
        const uint32_t a[4] = {pack_bf16(out_residual[2 * step][0] * scale, out_residual[2 * step][1] * scale),
                               pack_bf16(out_residual[2 * step][2] * scale, out_residual[2 * step][3] * scale),
                               pack_bf16(out_residual[2 * step + 1][0] * scale, out_residual[2 * step + 1][1] * scale),
                               pack_bf16(out_residual[2 * step + 1][2] * scale, out_residual[2 * step + 1][3] * scale)};
#pragma unroll
        for (int t = 0; t < kOutTiles; t += 2) {
          uint32_t b[4];
          ldmatrix_x4(b, bv_shared + (t * 8 + lane % 8 + (lane / 16) * 8) * kRankStride + step * 16 + ((lane / 8) % 2) * 8);
          mma_bf16(out[t], a, b[0], b[1]);
          mma_bf16(out[t + 1], a, b[2], b[3]);
        }
      }
    }
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 2);
  }
  const RowWriter writer{p, item, kv_head, group, sequence};
  const int rows_in_item = min(kRows, total_rows - item.row_begin);

  if constexpr (kKeyWarps == 1) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int local_row = row_warp * 16 + g + 8 * h;
      if (local_row >= rows_in_item) continue;
      const float inverse = row_sum[h] > 0.0f ? 1.0f / row_sum[h] : 0.0f;
#pragma unroll
      for (int t = 0; t < kOutTiles; ++t)
        writer.write(local_row, t * 8 + 2 * quad, out[t][2 * h] * inverse, out[t][2 * h + 1] * inverse);
      if (quad == 0) writer.write_lse(local_row, row_sum[h] > 0.0f ? row_max[h] + log2f(row_sum[h]) : -INFINITY);
    }
  } else {
    // Merge the key warps' partial (max, sum, O) through shared memory (the K/V
    // buffers are free now: the loop ended with a barrier).
    float* merge_out = reinterpret_cast<float*>(k_shared);  // [kKeyWarps][16][kHeadDim]
    float* merge_max = merge_out + kKeyWarps * 16 * kHeadDim;
    float* merge_sum = merge_max + kKeyWarps * 16;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = g + 8 * h;
      if (quad == 0) {
        merge_max[key_warp * 16 + r] = row_max[h];
        merge_sum[key_warp * 16 + r] = row_sum[h];
      }
#pragma unroll
      for (int t = 0; t < kOutTiles; ++t) {
        float* destination = merge_out + (key_warp * 16 + r) * kHeadDim + t * 8 + 2 * quad;
        destination[0] = out[t][2 * h];
        destination[1] = out[t][2 * h + 1];
      }
    }
    __syncthreads();
    for (int index = tid; index < 16 * (kHeadDim / 2); index += kThreads) {
      const int r = index / (kHeadDim / 2);
      const int d = (index % (kHeadDim / 2)) * 2;
      if (r >= rows_in_item) continue;
      float max_all = -INFINITY;
#pragma unroll
      for (int w = 0; w < kKeyWarps; ++w) max_all = fmaxf(max_all, merge_max[w * 16 + r]);
      const float shift = max_all == -INFINITY ? 0.0f : max_all;
      float sum = 0.0f, v0 = 0.0f, v1 = 0.0f;
#pragma unroll
      for (int w = 0; w < kKeyWarps; ++w) {
        const float weight = exp2f(merge_max[w * 16 + r] - shift);
        sum += merge_sum[w * 16 + r] * weight;
        v0 += merge_out[(w * 16 + r) * kHeadDim + d] * weight;
        v1 += merge_out[(w * 16 + r) * kHeadDim + d + 1] * weight;
      }
      const float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
      writer.write(r, d, v0 * inverse, v1 * inverse);
      if (d == 0) writer.write_lse(r, sum > 0.0f ? max_all + log2f(sum) : -INFINITY);
    }
  }
}

__global__ void attention_combine_kernel(AttentionParams p, const AttentionCombineItem* items) {
  pdl_wait();
  pdl_trigger();
  const AttentionCombineItem item = items[blockIdx.x];
  if (item.sequence < 0) return;  // padding of a graph-captured step's list
  const int kv_head = blockIdx.y;
  const AttentionSequence sequence = p.sequences[item.sequence];
  const int group = p.num_heads / p.num_kv_heads;
  const int head_dim = p.head_dim;
  for (int index = threadIdx.x; index < item.num_rows * head_dim; index += blockDim.x) {
    const int r = index / head_dim;
    const int d = index % head_dim;
    float max_all = -INFINITY;
#pragma unroll 4
    for (int k = 0; k < item.num_partials; ++k)
      max_all = fmaxf(max_all, p.partial_lse[(static_cast<int64_t>(item.first_partial + k) * p.num_kv_heads + kv_head) *
                                                 kAttentionMaxRows + r]);
    const float shift = max_all == -INFINITY ? 0.0f : max_all;
    float sum = 0.0f, value = 0.0f;
#pragma unroll 4
    for (int k = 0; k < item.num_partials; ++k) {
      const int64_t base = (static_cast<int64_t>(item.first_partial + k) * p.num_kv_heads + kv_head) * kAttentionMaxRows + r;
      const float weight = exp2f(p.partial_lse[base] - shift);
      sum += weight;
      value += weight * p.partial_out[base * head_dim + d];
    }
    const int row = item.row_begin + r;
    const int64_t token = sequence.query_row(row / group);
    const int head = kv_head * group + row % group;
    p.out[token * p.num_heads * head_dim + head * head_dim + d] = __float2bfloat16_rn(sum > 0.0f ? value / sum : 0.0f);
  }
}

// The rank tiers of ResidualAttention: shared memory and registers grow with the padded rank.
int32_t residual_rank_pad(int32_t rank) { return rank <= 16 ? 16 : rank <= 32 ? 32 : 64; }

template <int kHeadDim, int kRowWarps, int kRankPad, bool kFp8 = false>
void ensure_shared_attribute() {
  constexpr size_t kShared = attention_shared_bytes<kHeadDim, kRowWarps, kRankPad>();
  allow_dynamic_shared_memory<attention_kernel<kHeadDim, kRowWarps, kRankPad, kFp8>>(kShared);
}

template <int kHeadDim, int kRankPad>
int32_t decode_ctas_per_sm() {
  ensure_shared_attribute<kHeadDim, 1, kRankPad>();
  int count = 0;
  LOOM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&count, attention_kernel<kHeadDim, 1, kRankPad, false>, kThreads,
                                                                attention_shared_bytes<kHeadDim, 1, kRankPad>()));
  return count;
}

template <int kHeadDim>
int32_t decode_ctas_per_sm_for_rank(int32_t residual_rank) {
  if (residual_rank <= 0) return decode_ctas_per_sm<kHeadDim, 0>();
  switch (residual_rank_pad(residual_rank)) {
    case 16: return decode_ctas_per_sm<kHeadDim, 16>();
    case 32: return decode_ctas_per_sm<kHeadDim, 32>();
    default: return decode_ctas_per_sm<kHeadDim, 64>();
  }
}

template <int kHeadDim, int kRowWarps, int kRankPad, bool kFp8>
void launch_for(const AttentionParams& params, const AttentionWorkItem* items, int32_t num_items, Launch launch) {
  constexpr size_t kShared = attention_shared_bytes<kHeadDim, kRowWarps, kRankPad>();
  static_assert(4 * 16 * kHeadDim * sizeof(float) + 2 * 4 * 16 * sizeof(float) <= 4 * kTileKeys * (kHeadDim + 8) * sizeof(bf16),
                "the decode merge must fit in the K/V buffers");
  ensure_shared_attribute<kHeadDim, kRowWarps, kRankPad, kFp8>();
  const dim3 grid(num_items, params.num_kv_heads);
  launch_kernel(launch, grid, kThreads, kShared, attention_kernel<kHeadDim, kRowWarps, kRankPad, kFp8>, params, items);
}

template <int kRowWarps, int kRankPad, bool kFp8>
void dispatch_head_dim(const AttentionParams& params, const AttentionWorkItem* items, int32_t num_items,
                       Launch launch) {
  switch (params.head_dim) {
    case 16: return launch_for<16, kRowWarps, kRankPad, kFp8>(params, items, num_items, launch);
    case 32: return launch_for<32, kRowWarps, kRankPad, kFp8>(params, items, num_items, launch);
    case 64: return launch_for<64, kRowWarps, kRankPad, kFp8>(params, items, num_items, launch);
    case 128: return launch_for<128, kRowWarps, kRankPad, kFp8>(params, items, num_items, launch);
    default: throw_unsupported("cuda attention: head_dim (supported: 16, 32, 64, 128)", params.head_dim);
  }
}

template <int kRowWarps, bool kFp8>
void dispatch_rank(const AttentionParams& params, const AttentionWorkItem* items, int32_t num_items,
                   Launch launch, int32_t residual_rank) {
  if (residual_rank <= 0) return dispatch_head_dim<kRowWarps, 0, kFp8>(params, items, num_items, launch);
  if (residual_rank > kResidualMaxRank)
    throw_unsupported("cuda residual attention: k/v LoRA rank (supported: up to 64)", residual_rank);
  switch (residual_rank_pad(residual_rank)) {
    case 16: return dispatch_head_dim<kRowWarps, 16, kFp8>(params, items, num_items, launch);
    case 32: return dispatch_head_dim<kRowWarps, 32, kFp8>(params, items, num_items, launch);
    default: return dispatch_head_dim<kRowWarps, 64, kFp8>(params, items, num_items, launch);
  }
}

template <int kRowWarps>
void dispatch_dtype(const AttentionParams& params, const AttentionWorkItem* items, int32_t num_items, Launch launch,
                    int32_t residual_rank) {
  if (params.k_cache_fp8 != nullptr) return dispatch_rank<kRowWarps, true>(params, items, num_items, launch, residual_rank);
  dispatch_rank<kRowWarps, false>(params, items, num_items, launch, residual_rank);
}

template <int kHeadDim>
size_t shared_bytes_for(AttentionVariant variant, int32_t residual_rank) {
  const bool prefill = variant == AttentionVariant::kPrefill;
  if (residual_rank <= 0)
    return prefill ? attention_shared_bytes<kHeadDim, 4, 0>() : attention_shared_bytes<kHeadDim, 1, 0>();
  switch (residual_rank_pad(residual_rank)) {
    case 16: return prefill ? attention_shared_bytes<kHeadDim, 4, 16>() : attention_shared_bytes<kHeadDim, 1, 16>();
    case 32: return prefill ? attention_shared_bytes<kHeadDim, 4, 32>() : attention_shared_bytes<kHeadDim, 1, 32>();
    default: return prefill ? attention_shared_bytes<kHeadDim, 4, 64>() : attention_shared_bytes<kHeadDim, 1, 64>();
  }
}

}  // namespace

bool attention_supports_head_dim(int32_t head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

int32_t attention_decode_ctas_per_sm(int32_t head_dim, int32_t residual_rank) {
  switch (head_dim) {
    case 16: return decode_ctas_per_sm_for_rank<16>(residual_rank);
    case 32: return decode_ctas_per_sm_for_rank<32>(residual_rank);
    case 64: return decode_ctas_per_sm_for_rank<64>(residual_rank);
    case 128: return decode_ctas_per_sm_for_rank<128>(residual_rank);
    default: throw_unsupported("cuda attention: head_dim (supported: 16, 32, 64, 128)", head_dim);
  }
  return 0;
}

void launch_attention(const AttentionParams& params, AttentionVariant variant, const AttentionWorkItem* items,
                      int32_t num_items, Launch launch, int32_t residual_rank) {
  if (num_items == 0) return;
  if (variant == AttentionVariant::kPrefillWide || variant == AttentionVariant::kPrefillWidePingPong) {
    if (residual_rank > 0) throw_unsupported("cuda wide prefill attention: forked sequences (rank)", residual_rank);
    // Plain launches: the wide kernels wait for nothing in-kernel.
    if (variant == AttentionVariant::kPrefillWide)
      return launch_attention_wide(params, items, num_items, launch.stream);
    return launch_attention_pingpong(params, items, num_items, launch.stream);
  }
  if (variant == AttentionVariant::kPrefill) {
    dispatch_dtype<4>(params, items, num_items, launch, residual_rank);
  } else {
    dispatch_dtype<1>(params, items, num_items, launch, residual_rank);
  }
}

size_t attention_shared_bytes(int32_t head_dim, AttentionVariant variant, int32_t residual_rank) {
  if (variant == AttentionVariant::kPrefillWide) return attention_wide_shared_bytes(head_dim);
  if (variant == AttentionVariant::kPrefillWidePingPong) return attention_pingpong_shared_bytes(head_dim);
  switch (head_dim) {
    case 16: return shared_bytes_for<16>(variant, residual_rank);
    case 32: return shared_bytes_for<32>(variant, residual_rank);
    case 64: return shared_bytes_for<64>(variant, residual_rank);
    case 128: return shared_bytes_for<128>(variant, residual_rank);
    default: throw_unsupported("cuda attention: head_dim (supported: 16, 32, 64, 128)", head_dim);
  }
  return 0;
}

void launch_attention_combine(const AttentionParams& params, const AttentionCombineItem* items, int32_t num_items,
                              Launch launch) {
  if (num_items == 0) return;
  const dim3 grid(num_items, params.num_kv_heads);
  launch_kernel(launch, grid, 256, 0, attention_combine_kernel, params, items);
}

}  // namespace loom::cuda
