// ResidualAttention decode (ForkKV, arXiv:2604.06370 §5.3) for head dims 64 and
// 128 over a bf16 cache: attention.cu's decode variant with the head dims split
// between warp pairs, so a CTA holds half the registers and shared memory and
// three fit on an SM where two of attention.cu's did (ncu, H200: that kernel
// issued on 35% of cycles with 2 warps per scheduler, stalled on its own
// dependencies; it ran 1.38x paged attention's time at decode 64 x 2K).
//
// A CTA (128 threads) runs one work item (up to 16 rows of one sequence) for
// one kv head, over tiles of 32 keys (K, V, rK, rV double-buffered with cp.async).
// Warp w = 2 slice + half: slice owns keys [16 slice, 16 slice + 16) of each
// tile; half owns the head dims of rebuild steps j in [half J/2, half J/2 + J/2)
// (J = head_dim / 32): dims [16 j, 16 j + 16) and their rotate-half partners
// + head_dim / 2. Each warp of a pair computes its dims' part of Q K^T, rebuilds
// its dims of the residual keys (residual_keys.cuh's decode form, restricted to
// its steps) and adds Q·(those dims), then the pair swaps partial scores through
// shared memory: both hold every score of their 16 keys and run the same online
// softmax. P·V fills each warp's own output dims; P·rV (rank-wide, small) is
// computed by both, and meets s_v B_v^T once at the end for the warp's dims.
// The two slices merge (max, sum, O) through shared memory as attention.cu's
// decode warps do.
#include <cfloat>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernel_attributes.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/residual_keys.cuh"
#include "backend/cuda/row_writer.cuh"

namespace loom::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kTileKeys = 32;
constexpr int kRows = 16;

template <int kHeadDim, int kRankPad>
constexpr size_t shared_bytes() {
  constexpr int kStride = kHeadDim + 8;
  constexpr int kRankStride = kRankPad + 8;
  return (static_cast<size_t>(kRows + 4 * kTileKeys) * kStride + static_cast<size_t>(2 * kHeadDim + 4 * kTileKeys) * kRankStride) *
             sizeof(bf16) +
         (kHeadDim / 4) * (sizeof(float4) + sizeof(float2)) +  // RoPE table
         2 * 2 * 32 * 8 * sizeof(float);                         // the pairs' score exchange
}

template <int kRankPad>
constexpr int min_ctas() { return kRankPad <= 32 ? 3 : 2; }

// 2^x on the SFU alone (exp2f adds a denormal-range scaling around it): x <= 0
// here, and results below 2^-126 flush to zero, which the softmax sums ignore.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ void pair_barrier(int slice) {
  asm volatile("bar.sync %0, 64;\n" ::"r"(slice + 1) : "memory");
}

template <int kHeadDim, int kRankPad>
__global__ void __launch_bounds__(kThreads, min_ctas<kRankPad>())
    residual_decode_kernel(AttentionParams p, const AttentionWorkItem* items) {
  pdl_wait();
  pdl_trigger();
  constexpr int kStride = kHeadDim + 8;
  constexpr int kChunksPerRow = kHeadDim / 8;
  constexpr int kHalf = kHeadDim / 2;
  constexpr int kSteps = kHalf / 16;         // J: rebuild steps (16 dims and their partners each)
  constexpr int kOwnSteps = kSteps / 2;      // a warp's
  constexpr int kOwnTiles = 4 * kOwnSteps;   // a warp's output n-tiles (8 dims each)
  constexpr int kRankStride = kRankPad + 8;
  constexpr int kRankSteps = kRankPad / 16;
  constexpr int kRankTiles = kRankPad / 8;
  static_assert(kSteps % 2 == 0, "the head dims split in two");

  extern __shared__ __align__(16) unsigned char shared_raw[];
  bf16* q_shared = reinterpret_cast<bf16*>(shared_raw);  // [kRows][kStride]
  bf16* k_shared = q_shared + kRows * kStride;            // [2][kTileKeys][kStride]
  bf16* v_shared = k_shared + 2 * kTileKeys * kStride;
  bf16* bk_shared = v_shared + 2 * kTileKeys * kStride;   // [kHeadDim][kRankStride]
  bf16* bv_shared = bk_shared + kHeadDim * kRankStride;
  bf16* rk_shared = bv_shared + kHeadDim * kRankStride;   // [2][kTileKeys][kRankStride]
  bf16* rv_shared = rk_shared + 2 * kTileKeys * kRankStride;
  float4* rope_shared = reinterpret_cast<float4*>(rv_shared + 2 * kTileKeys * kRankStride);  // [kHeadDim / 4]
  float2* rope_sin_shared = reinterpret_cast<float2*>(rope_shared + kHeadDim / 4);
  float4* exchange = reinterpret_cast<float4*>(rope_sin_shared + kHeadDim / 4);  // [slice][half][lane][2]

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
  const int slice = warp / 2;
  const int half = warp % 2;
  const int first_step = half * kOwnSteps;
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

  const LoraModuleRef module_k = lora_module(p.lora_modules, sequence.forked_slot, p.num_layers, p.layer, kLoraTargetK);
  const LoraModuleRef module_v = lora_module(p.lora_modules, sequence.forked_slot, p.num_layers, p.layer, kLoraTargetV);
  const int32_t* residual_table = p.residual_block_tables + sequence.residual_block_table_offset;
  // This kv head's rows of B_k and B_v, zero past the rank; 16-byte loads where the rows allow.
  auto load_b = [&](const LoraModuleRef& module, bf16* destination) {
    const int64_t first_row = static_cast<int64_t>(kv_head) * kHeadDim;
    if (module.rank % 8 == 0 && (reinterpret_cast<uintptr_t>(module.b) & 15) == 0) {
      constexpr int kChunks = kRankPad / 8;
      for (int index = tid; index < kHeadDim * kChunks; index += kThreads) {
        const int d = index / kChunks;
        const int c = index % kChunks;
        uint4 value = make_uint4(0, 0, 0, 0);
        if (c * 8 < module.rank) value = *reinterpret_cast<const uint4*>(module.b + (first_row + d) * module.rank + c * 8);
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
  for (int pair = tid; pair < kHeadDim / 4; pair += kThreads) {
    const float f0 = p.inv_freq[2 * pair], f1 = p.inv_freq[2 * pair + 1];
    float c0, s0, c1, s1;
    sincosf(8.0f * f0, &s0, &c0);
    sincosf(8.0f * f1, &s1, &c1);
    rope_shared[pair] = make_float4(f0, f1, c0, c1);
    rope_sin_shared[pair] = make_float2(s0, s1);
  }

  constexpr int kLoadRows = kThreads / kChunksPerRow;
  constexpr int kLoadPasses = kTileKeys / kLoadRows;
  static_assert(kThreads % kChunksPerRow == 0 && kTileKeys % kLoadRows == 0, "whole rows per pass");
  const PagedGather kv_gather = PagedGather::kv(block_table, kv_head, p.block_size, p.num_kv_heads, kHeadDim);
  const int load_row = tid / kChunksPerRow;
  const int load_chunk = tid % kChunksPerRow;
  constexpr int kRankChunks = kRankPad / 8;
  constexpr int kResidualLoadRows = kThreads / kRankChunks;
  constexpr int kResidualLoadPasses = (kTileKeys + kResidualLoadRows - 1) / kResidualLoadRows;
  const PagedGather residual_gather =
      PagedGather::rows(residual_table, p.residual_block_size, 2 * static_cast<int64_t>(p.residual_rank_stride));
  const int residual_load_row = tid / kRankChunks;
  const int residual_load_chunk = tid % kRankChunks;

  auto load_tile = [&](int tile_start, int buffer) {
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
    int64_t offset[kLoadPasses];
    kv_gather.tile_offsets(tile_start, load_row, kLoadRows, item.kv_end, load_chunk * 8, offset);
#pragma unroll
    for (int i = 0; i < kLoadPasses; ++i) {
      const int r = load_row + i * kLoadRows;
      const bool valid = tile_start + r < item.kv_end;
      const int destination = (buffer * kTileKeys + r) * kStride + load_chunk * 8;
      cp_async_16(k_shared + destination, p.k_cache + offset[i], valid);
      cp_async_16(v_shared + destination, p.v_cache + offset[i], valid);
    }
    cp_async_commit();
  };

  const int num_tiles = (item.kv_end - item.kv_begin + kTileKeys - 1) / kTileKeys;
  load_tile(item.kv_begin, 0);
  __syncthreads();  // q_shared, B and the RoPE table written with plain stores

  // The warp's query k-steps: [0, kOwnSteps) are dims 16 (first_step + s), the rest their partners.
  auto step_dim = [&](int s) { return (s < kOwnSteps ? first_step + s : kSteps + first_step + s - kOwnSteps) * 16; };
  uint32_t q_fragments[2 * kOwnSteps][4];
#pragma unroll
  for (int s = 0; s < 2 * kOwnSteps; ++s)
    ldmatrix_x4(q_fragments[s], q_shared + (lane % 16) * kStride + step_dim(s) + (lane / 16) * 8);
  // The warp's output n-tiles: [0, 2 kOwnSteps) are dims 8 (2 first_step + t), the rest their partners.
  auto tile_dim = [&](int t) {
    return (t < 2 * kOwnSteps ? 2 * first_step + t : 2 * kSteps + 2 * first_step + t - 2 * kOwnSteps) * 8;
  };

  const int g = lane / 4;
  const int quad = lane % 4;
  int row_limit[2];  // exclusive key limit per owned row (0 for padding rows: everything masked)
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = item.row_begin + g + 8 * h;
    const int causal = row < total_rows ? sequence.num_computed_tokens + sequence.query_token(row / group) + 1 : 0;
    row_limit[h] = causal < item.kv_end ? causal : item.kv_end;
  }
  const float scale_log2 = p.scale * 1.4426950408889634f;

  float out[kOwnTiles][4];
#pragma unroll
  for (int t = 0; t < kOwnTiles; ++t) out[t][0] = out[t][1] = out[t][2] = out[t][3] = 0.0f;
  float out_residual[kRankTiles][4];  // P·rV
#pragma unroll
  for (int t = 0; t < kRankTiles; ++t) out_residual[t][0] = out_residual[t][1] = out_residual[t][2] = out_residual[t][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};

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

    const int first_key = tile_start + slice * 16;
    // Both warps of a pair see the same keys and rows: they skip together (the pair barrier below).
    const bool any_visible = __any_sync(0xffffffffu, first_key < row_limit[0] || first_key < row_limit[1]);
    if (any_visible) {
      const bf16* k_base = k_shared + (buffer * kTileKeys + slice * 16) * kStride;
      float score[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
      for (int s = 0; s < 2 * kOwnSteps; ++s) {
        uint32_t b[4];
        ldmatrix_x4(b, k_base + (lane % 8 + (lane / 16) * 8) * kStride + step_dim(s) + ((lane / 8) % 2) * 8);
        mma_bf16(score[0], q_fragments[s], b[0], b[1]);
        mma_bf16(score[1], q_fragments[s], b[2], b[3]);
      }
      if (module_k.rank > 0) {
        // The residual keys' dims of this warp's steps, rebuilt in registers (residual_keys.cuh, decode form).
        uint32_t a[kRankSteps][4];
        load_rank_fragments<kRankPad>(rk_shared + (buffer * kTileKeys + slice * 16) * kRankStride, lane, a);
        const float position = static_cast<float>(first_key + g);
        float residual[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int s = 0; s < kOwnSteps; ++s) {
          const int j = first_step + s;
          uint32_t low[2][2], high[2][2];  // [u][h]
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const int t = 2 * j + u;
            float first[4] = {0.0f, 0.0f, 0.0f, 0.0f}, second[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int step = 0; step < kRankSteps; ++step) {
              uint32_t fragment[4];  // B rows d (matrices 0, 1) and d + kHalf (2, 3)
              ldmatrix_x4(fragment, bk_shared + (t * 8 + lane % 8 + (lane / 16) * kHalf) * kRankStride + step * 16 +
                                        ((lane / 8) % 2) * 8);
              mma_bf16(first, a[step], fragment[0], fragment[1]);
              mma_bf16(second, a[step], fragment[2], fragment[3]);
            }
            const int pair = t * 4 + quad;  // head dims d = 2 pair, d + 1
            const float4 table = rope_shared[pair];
            const float2 sin8 = rope_sin_shared[pair];
            float cosine[2][2], sine[2][2];  // [h][e]
            reduced_sincos(__fmul_rn(table.x, position), sine[0][0], cosine[0][0]);
            reduced_sincos(__fmul_rn(table.y, position), sine[0][1], cosine[0][1]);
            const float cos8[2] = {table.z, table.w}, sin8v[2] = {sin8.x, sin8.y};
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              cosine[1][e] = fmaf(cosine[0][e], cos8[e], -sine[0][e] * sin8v[e]);
              sine[1][e] = fmaf(sine[0][e], cos8[e], cosine[0][e] * sin8v[e]);
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const float x0 = first[2 * h], x1 = first[2 * h + 1];
              const float y0 = second[2 * h], y1 = second[2 * h + 1];
              low[u][h] = pack_bf16(fmaf(x0, cosine[h][0], -y0 * sine[h][0]), fmaf(x1, cosine[h][1], -y1 * sine[h][1]));
              high[u][h] = pack_bf16(fmaf(y0, cosine[h][0], x0 * sine[h][0]), fmaf(y1, cosine[h][1], x1 * sine[h][1]));
            }
          }
          mma_bf16(residual[0], q_fragments[s], low[0][0], low[1][0]);
          mma_bf16(residual[1], q_fragments[s], low[0][1], low[1][1]);
          mma_bf16(residual[0], q_fragments[kOwnSteps + s], high[0][0], high[1][0]);
          mma_bf16(residual[1], q_fragments[kOwnSteps + s], high[0][1], high[1][1]);
        }
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e) score[t][e] = fmaf(module_k.scale, residual[t][e], score[t][e]);
      }
      // Swap partial scores with the other half of the pair (the last tile's reads ended at its barrier).
      float4* mine = exchange + ((slice * 2 + half) * 32 + lane) * 2;
      const float4* theirs = exchange + ((slice * 2 + (half ^ 1)) * 32 + lane) * 2;
      mine[0] = make_float4(score[0][0], score[0][1], score[0][2], score[0][3]);
      mine[1] = make_float4(score[1][0], score[1][1], score[1][2], score[1][3]);
      pair_barrier(slice);
      const float4 other0 = theirs[0], other1 = theirs[1];
      // Summed in the same order on both warps, so both hold identical scores.
      const float other[2][4] = {{other0.x, other0.y, other0.z, other0.w}, {other1.x, other1.y, other1.z, other1.w}};
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) score[t][e] = half == 0 ? score[t][e] + other[t][e] : other[t][e] + score[t][e];

      float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int t = 0; t < 2; ++t) {
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
      for (int t = 0; t < 2; ++t) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          score[t][e] = exp2_approx(score[t][e] - shift[e / 2]);
          tile_sum[e / 2] += score[t][e];
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) row_sum[h] = row_sum[h] * rescale[h] + tile_sum[h];
      // Past the first tiles a row's maximum rarely moves: skip the rescale (by exactly 1) when none did.
      if (__any_sync(0xffffffffu, rescale[0] != 1.0f || rescale[1] != 1.0f)) {
#pragma unroll
        for (int t = 0; t < kOwnTiles; ++t) {
          out[t][0] *= rescale[0];
          out[t][1] *= rescale[0];
          out[t][2] *= rescale[1];
          out[t][3] *= rescale[1];
        }
#pragma unroll
        for (int t = 0; t < kRankTiles; ++t) {
          out_residual[t][0] *= rescale[0];
          out_residual[t][1] *= rescale[0];
          out_residual[t][2] *= rescale[1];
          out_residual[t][3] *= rescale[1];
        }
      }

      const uint32_t a[4] = {pack_bf16(score[0][0], score[0][1]), pack_bf16(score[0][2], score[0][3]),
                             pack_bf16(score[1][0], score[1][1]), pack_bf16(score[1][2], score[1][3])};
      const bf16* v_base = v_shared + (buffer * kTileKeys + slice * 16) * kStride;
#pragma unroll
      for (int t = 0; t < kOwnTiles; t += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_base + (lane % 8 + ((lane / 8) % 2) * 8) * kStride + tile_dim(t) + (lane / 16) * 8);
        mma_bf16(out[t], a, b[0], b[1]);
        mma_bf16(out[t + 1], a, b[2], b[3]);
      }
      if (module_v.rank > 0) {
        const bf16* rv_base = rv_shared + (buffer * kTileKeys + slice * 16) * kRankStride;
#pragma unroll
        for (int t = 0; t < kRankTiles; t += 2) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, rv_base + (lane % 8 + ((lane / 8) % 2) * 8) * kRankStride + t * 8 + (lane / 16) * 8);
          mma_bf16(out_residual[t], a, b[0], b[1]);
          mma_bf16(out_residual[t + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // everyone is done with `buffer` (and the exchange) before they are refilled
  }
  // V's up-projection, once, for the warp's dims: out += (P·rV) · s_v B_v^T.
  if (module_v.rank > 0) {
#pragma unroll
    for (int step = 0; step < kRankSteps; ++step) {
      const float scale = module_v.scale;
      const uint32_t a[4] = {pack_bf16(out_residual[2 * step][0] * scale, out_residual[2 * step][1] * scale),
                             pack_bf16(out_residual[2 * step][2] * scale, out_residual[2 * step][3] * scale),
                             pack_bf16(out_residual[2 * step + 1][0] * scale, out_residual[2 * step + 1][1] * scale),
                             pack_bf16(out_residual[2 * step + 1][2] * scale, out_residual[2 * step + 1][3] * scale)};
#pragma unroll
      for (int t = 0; t < kOwnTiles; t += 2) {
        uint32_t b[4];
        ldmatrix_x4(b, bv_shared + (tile_dim(t) + lane % 8 + (lane / 16) * 8) * kRankStride + step * 16 +
                           ((lane / 8) % 2) * 8);
        mma_bf16(out[t], a, b[0], b[1]);
        mma_bf16(out[t + 1], a, b[2], b[3]);
      }
    }
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 1);
    row_sum[h] += __shfl_xor_sync(0xffffffffu, row_sum[h], 2);
  }
  // Merge the two slices' (max, sum, O) through shared memory (the K/V buffers
  // are free: the loop ended with a barrier). Each warp writes its own dims.
  float* merge_out = reinterpret_cast<float*>(k_shared);  // [2][kRows][kHeadDim]
  float* merge_max = merge_out + 2 * kRows * kHeadDim;
  float* merge_sum = merge_max + 2 * kRows;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = g + 8 * h;
    if (quad == 0 && half == 0) {
      merge_max[slice * kRows + r] = row_max[h];
      merge_sum[slice * kRows + r] = row_sum[h];
    }
#pragma unroll
    for (int t = 0; t < kOwnTiles; ++t) {
      float* destination = merge_out + (slice * kRows + r) * kHeadDim + tile_dim(t) + 2 * quad;
      destination[0] = out[t][2 * h];
      destination[1] = out[t][2 * h + 1];
    }
  }
  __syncthreads();
  const RowWriter writer{p, item, kv_head, group, sequence};
  const int rows_in_item = min(kRows, total_rows - item.row_begin);
  for (int index = tid; index < kRows * (kHeadDim / 2); index += kThreads) {
    const int r = index / (kHeadDim / 2);
    const int d = (index % (kHeadDim / 2)) * 2;
    if (r >= rows_in_item) continue;
    const float max_all = fmaxf(merge_max[r], merge_max[kRows + r]);
    const float shift = max_all == -INFINITY ? 0.0f : max_all;
    float sum = 0.0f, v0 = 0.0f, v1 = 0.0f;
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      const float weight = exp2f(merge_max[w * kRows + r] - shift);
      sum += merge_sum[w * kRows + r] * weight;
      v0 += merge_out[(w * kRows + r) * kHeadDim + d] * weight;
      v1 += merge_out[(w * kRows + r) * kHeadDim + d + 1] * weight;
    }
    const float inverse = sum > 0.0f ? 1.0f / sum : 0.0f;
    writer.write(r, d, v0 * inverse, v1 * inverse);
    if (d == 0) writer.write_lse(r, sum > 0.0f ? max_all + log2f(sum) : -INFINITY);
  }
}

template <int kHeadDim, int kRankPad>
void ensure_attribute() {
  static_assert(2 * kRows * kHeadDim * sizeof(float) + 4 * kRows * sizeof(float) <=
                    4 * kTileKeys * (kHeadDim + 8) * sizeof(bf16),
                "the slices' merge must fit in the K/V buffers");
  allow_dynamic_shared_memory<residual_decode_kernel<kHeadDim, kRankPad>>(shared_bytes<kHeadDim, kRankPad>());
}

template <int kHeadDim, int kRankPad>
int32_t ctas_per_sm() {
  ensure_attribute<kHeadDim, kRankPad>();
  int count = 0;
  LOOM_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&count, residual_decode_kernel<kHeadDim, kRankPad>,
                                                                kThreads, shared_bytes<kHeadDim, kRankPad>()));
  return count;
}

template <int kHeadDim, int kRankPad>
void launch_for(const AttentionParams& params, const AttentionWorkItem* items, int32_t num_items, Launch launch) {
  ensure_attribute<kHeadDim, kRankPad>();
  const dim3 grid(num_items, params.num_kv_heads);
  launch_kernel(launch, grid, kThreads, shared_bytes<kHeadDim, kRankPad>(), residual_decode_kernel<kHeadDim, kRankPad>,
                params, items);
}

}  // namespace

bool residual_decode_supports(int32_t head_dim, bool fp8_cache) {
  return !fp8_cache && (head_dim == 64 || head_dim == 128);
}

// The supported shapes (residual_decode_supports), by head dim and rank tier.
#define LOOM_RESIDUAL_DECODE_DISPATCH(head_dim, residual_rank, CALL)      \
  do {                                                                    \
    const int32_t pad_ = residual_rank_pad(residual_rank);                \
    if ((head_dim) == 64) {                                               \
      if (pad_ == 16) CALL(64, 16);                                       \
      if (pad_ == 32) CALL(64, 32);                                       \
      CALL(64, 64);                                                       \
    }                                                                     \
    if (pad_ == 16) CALL(128, 16);                                        \
    if (pad_ == 32) CALL(128, 32);                                        \
    CALL(128, 64);                                                        \
  } while (false)

int32_t residual_decode_ctas_per_sm(int32_t head_dim, int32_t residual_rank) {
#define LOOM_CALL(D, R) return ctas_per_sm<D, R>()
  LOOM_RESIDUAL_DECODE_DISPATCH(head_dim, residual_rank, LOOM_CALL);
#undef LOOM_CALL
}

size_t residual_decode_shared_bytes(int32_t head_dim, int32_t residual_rank) {
#define LOOM_CALL(D, R) return shared_bytes<D, R>()
  LOOM_RESIDUAL_DECODE_DISPATCH(head_dim, residual_rank, LOOM_CALL);
#undef LOOM_CALL
}

void launch_residual_decode(const AttentionParams& params, const AttentionWorkItem* items, int32_t num_items,
                            Launch launch, int32_t residual_rank) {
  if (num_items == 0) return;
#define LOOM_CALL(D, R) return launch_for<D, R>(params, items, num_items, launch)
  LOOM_RESIDUAL_DECODE_DISPATCH(params.head_dim, residual_rank, LOOM_CALL);
#undef LOOM_CALL
}

}  // namespace loom::cuda
