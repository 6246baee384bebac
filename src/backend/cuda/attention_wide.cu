// Wide prefill attention for sm_90a: warpgroup MMA (wgmma), FlashAttention-3
// style, over the paged cache.
//
// A CTA (two warpgroups, 256 threads) runs one work item of up to 128 rows of
// (token, query head) for one kv head (blockIdx.y); warpgroup w owns rows
// [64w, 64w + 64). Q and 128-key K/V tiles are gathered through the block
// table with cp.async into 128-byte-swizzled shared memory (wgmma.cuh), two
// stages deep. Per tile each warpgroup issues S = Q K^T as wgmma m64n128k16
// with both operands in shared memory, runs the online softmax (log2 domain)
// on the accumulators, and issues O += P V with P from registers (the S
// accumulators packed to bf16 are exactly wgmma's A fragments) and V read
// MN-major. The two warpgroups' softmax and MMAs overlap on the SM.
// Masking and row numbering are attention.cu's: row (token i) sees key j iff
// j < kv_end and j <= num_computed + i; decoder rows (base sharing) are queries
// after the new tokens. Wide items are never split (no partials).
// 193 / 161 registers for head dims 128 / 64, no spills. Wide prefills run on
// attention_pingpong.cu's kernel by default (CudaTuning::pingpong_prefill);
// this one where that is off or the block size is not a power of two from 4,
// and as its bit-for-bit reference in CudaAttention.WidePrefill*.
#include <cfloat>

#include "backend/cuda/attention_wide.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernel_attributes.cuh"
#include "backend/cuda/kv_fp8.cuh"

namespace loom::cuda {

namespace {

constexpr int kWideThreads = 256;
constexpr int kWideRows = kAttentionWideRows;
constexpr int kWideKeys = kWideTileKeys;

template <int kHeadDim>
constexpr size_t wide_shared_bytes() {
  // Q [128][d], two stages of K and V [128][d], + slack to align to 1024 bytes.
  return static_cast<size_t>(kWideRows + 4 * kWideKeys) * kHeadDim * sizeof(bf16) + 1024;
}

// kFp8: the main pool is an FP8 cache, decoded into the bf16 stages as it is loaded (kv_fp8.cuh).
template <int kHeadDim, bool kFp8>
__global__ void __launch_bounds__(kWideThreads, 1) attention_wide_kernel(AttentionParams p, const AttentionWorkItem* items) {
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks a row
  constexpr uint32_t kQBytes = kWideRows * kHeadDim * sizeof(bf16);
  constexpr uint32_t kTileBytes = kWideKeys * kHeadDim * sizeof(bf16);
  constexpr int kOut = kHeadDim / 2;  // O accumulators a thread

  extern __shared__ __align__(16) unsigned char shared_raw[];
  const WideShared shared = wide_shared_base(shared_raw);
  unsigned char* base = shared.pointer;
  const uint32_t q_address = shared.address;
  const uint32_t k_address = q_address + kQBytes;                   // [2 stages]
  const uint32_t v_address = q_address + kQBytes + 2 * kTileBytes;  // [2 stages]

  const AttentionWorkItem item = items[blockIdx.x];
  if (item.sequence < 0) return;
  const int kv_head = blockIdx.y;
  const AttentionSequence sequence = p.sequences[item.sequence];
  const int group = p.num_heads / p.num_kv_heads;
  const int total_rows = sequence.num_queries() * group;
  const int tid = threadIdx.x;
  const int warpgroup = tid / 128;
  const int warp = (tid / 32) % 4;
  const int lane = tid % 32;
  const int g = lane / 4;
  const int quad = lane % 4;
  const int32_t* block_table = p.block_tables + sequence.block_table_offset;

  wide_load_q<kHeadDim>(p, item, sequence, kv_head, group, total_rows, tid, kWideThreads, base);
  // Thread tid copies chunk tid % kChunks of rows tid / kChunks + kLoadRows * i: one
  // address computation per row, all block-table reads of a tile in flight together.
  constexpr int kLoadRows = kWideThreads / kChunks;
  constexpr int kLoadPasses = kWideKeys / kLoadRows;
  static_assert(kWideThreads % kChunks == 0 && kWideKeys % kLoadRows == 0, "whole rows per pass");
  const PagedGather kv_gather = PagedGather::kv(block_table, kv_head, p.block_size, p.num_kv_heads, kHeadDim);
  const int load_row = tid / kChunks;
  const int load_chunk = tid % kChunks;
  uint2 fetched_k[kFp8 ? kLoadPasses : 1], fetched_v[kFp8 ? kLoadPasses : 1];  // FP8: the next tile, in flight
  auto load_tile = [&](int tile_start, int stage) {
    unsigned char* k_stage = base + kQBytes + stage * kTileBytes;
    unsigned char* v_stage = base + kQBytes + (2 + stage) * kTileBytes;
    int64_t offset[kLoadPasses];
    kv_gather.tile_offsets(tile_start, load_row, kLoadRows, item.kv_end, load_chunk * 8, offset);
#pragma unroll
    for (int i = 0; i < kLoadPasses; ++i) {
      const int r = load_row + i * kLoadRows;
      const bool valid = tile_start + r < item.kv_end;
      if constexpr (kFp8) {  // into registers; store_fetched puts them in `stage` after this tile's math
        fetched_k[i] = kv_fp8_fetch8(p.k_cache_fp8 + offset[i], valid);
        fetched_v[i] = kv_fp8_fetch8(p.v_cache_fp8 + offset[i], valid);
      } else {
        const uint32_t destination = swizzled_chunk_offset(r, load_chunk, kWideKeys);
        cp_async_16(k_stage + destination, p.k_cache + offset[i], valid);
        cp_async_16(v_stage + destination, p.v_cache + offset[i], valid);
      }
    }
    cp_async_commit();
  };
  // FP8: the fetched tile decoded into `stage` (plain stores: the fence and barrier at the next tile publish them to wgmma).
  auto store_fetched = [&](int stage) {
    unsigned char* k_stage = base + kQBytes + stage * kTileBytes;
    unsigned char* v_stage = base + kQBytes + (2 + stage) * kTileBytes;
#pragma unroll
    for (int i = 0; i < kLoadPasses; ++i) {
      const uint32_t destination = swizzled_chunk_offset(load_row + i * kLoadRows, load_chunk, kWideKeys);
      kv_fp8_store8(k_stage + destination, fetched_k[i], p.k_scale);
      kv_fp8_store8(v_stage + destination, fetched_v[i], p.v_scale);
    }
  };

  const WideRowLimits limits = wide_row_limits(sequence, item, group, total_rows, warpgroup, warp, g);
  const int(&row_limit)[2] = limits.row;
  const int warpgroup_limit = limits.warpgroup;
  const int min_row_limit = min(row_limit[0], row_limit[1]);
  const float scale_log2 = p.scale * 1.4426950408889634f;

  float o[kOut];
#pragma unroll
  for (int i = 0; i < kOut; ++i) o[i] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};
  float s[64];

  const int num_tiles = (item.kv_end + kWideKeys - 1) / kWideKeys;
  load_tile(0, 0);  // the same commit group as Q
  if constexpr (kFp8) store_fetched(0);
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = tile & 1;
    const int tile_start = tile * kWideKeys;
    if (tile + 1 < num_tiles) {
      load_tile(tile_start + kWideKeys, stage ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    fence_proxy_async_shared();
    __syncthreads();
    if (tile_start < warpgroup_limit) {  // uniform over the warpgroup, as wgmma needs
      wide_issue_qk<kHeadDim>(s, q_address, k_address + stage * kTileBytes, warpgroup);
      wgmma_wait<0>();
      fence_accumulators(s);

      float rescale[2], tile_sum[2];
      wide_softmax_tile(s, tile_start, row_limit, min_row_limit, scale_log2, quad, row_max, rescale, tile_sum);
      uint32_t a[kWideKeys / 16][4];
      pack_probabilities(s, a);
      wide_rescale(o, row_sum, rescale, tile_sum);
      wide_issue_pv<kHeadDim>(o, a, v_address + stage * kTileBytes);
      wgmma_wait<0>();
      fence_accumulators(o);
    }
    if constexpr (kFp8) {
      if (tile + 1 < num_tiles) store_fetched(stage ^ 1);  // read by no one since the last barrier
    }
    __syncthreads();  // both warpgroups are done with `stage` before it is refilled
  }

  wide_store_rows<kHeadDim>(p, item, sequence, kv_head, group, total_rows, warpgroup, warp, g, quad, o, row_sum);
}

template <int kHeadDim, bool kFp8>
void launch_wide_for(const AttentionParams& params, const AttentionWorkItem* items, int32_t num_items,
                     cudaStream_t stream) {
  constexpr size_t kShared = wide_shared_bytes<kHeadDim>();
  allow_dynamic_shared_memory<attention_wide_kernel<kHeadDim, kFp8>>(kShared);
  const dim3 grid(num_items, params.num_kv_heads);
  attention_wide_kernel<kHeadDim, kFp8><<<grid, kWideThreads, kShared, stream>>>(params, items);
  LOOM_CUDA_CHECK_LAUNCH();
}

template <int kHeadDim>
void launch_wide(const AttentionParams& params, const AttentionWorkItem* items, int32_t num_items,
                 cudaStream_t stream) {
  if (params.k_cache_fp8 != nullptr) return launch_wide_for<kHeadDim, true>(params, items, num_items, stream);
  launch_wide_for<kHeadDim, false>(params, items, num_items, stream);
}

}  // namespace

bool attention_wide_supports_head_dim(int32_t head_dim) { return head_dim == 64 || head_dim == 128; }

size_t attention_wide_shared_bytes(int32_t head_dim) {
  return head_dim == 128 ? wide_shared_bytes<128>() : wide_shared_bytes<64>();
}

void launch_attention_wide(const AttentionParams& params, const AttentionWorkItem* items, int32_t num_items,
                           cudaStream_t stream) {
  if (num_items == 0) return;
  switch (params.head_dim) {
    case 64: return launch_wide<64>(params, items, num_items, stream);
    case 128: return launch_wide<128>(params, items, num_items, stream);
    default: throw_unsupported("cuda wide prefill attention: head_dim (supported: 64, 128)", params.head_dim);
  }
}

}  // namespace loom::cuda
