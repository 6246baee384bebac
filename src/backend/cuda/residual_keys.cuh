// ResidualAttention's key rebuild (ForkKV, arXiv:2604.06370 §5.3), for attention.cu's
// forked kernels: the residual part of a key, RoPE_j(s_k · rK_j · B_k^T), from
// the rCache row rK_j and this kv head's rows of B_k in shared memory, on
// tensor cores. A C fragment's head dim d and its rotate-half partner
// d + head_dim / 2 land in the same lane (n-tiles t and t + head_dim / 16), so
// RoPE runs in registers.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include "backend/cuda/mma.cuh"

namespace loom::cuda {

// sin / cos of an fp32 angle on the SFU, the angle reduced to [-pi, pi] exactly
// enough (Cody-Waite, 2 pi in two parts; abs error ~4e-7), far below the bf16
// the rebuilt keys are packed to, and no table traffic competes with the K/V tiles.
__device__ __forceinline__ void reduced_sincos(float angle, float& sine, float& cosine) {
  const float turns = rintf(angle * 0.159154943091895336f);
  float reduced = fmaf(-turns, 6.28318548202514648f, angle);
  reduced = fmaf(-turns, -1.74845553e-07f, reduced);
  __sincosf(reduced, &sine, &cosine);
}
// cos / sin of RoPE at `position` for frequencies d and d + 1, the angle being
// the qkv post-processing's fp32 product.
__device__ __forceinline__ void rope_cos_sin(const float* inv_freq, int position, int d, float2& c, float2& s) {
  reduced_sincos(__fmul_rn(__ldg(inv_freq + d), static_cast<float>(position)), s.x, c.x);
  reduced_sincos(__fmul_rn(__ldg(inv_freq + d + 1), static_cast<float>(position)), s.y, c.y);
}

// A fragments of 16 rK rows ([16][kRankPad + 8] bf16) for the rank-r up-projection's MMAs.
template <int kRankPad>
__device__ __forceinline__ void load_rank_fragments(const __nv_bfloat16* rk_rows, int lane,
                                                    uint32_t (&a)[kRankPad / 16][4]) {
#pragma unroll
  for (int step = 0; step < kRankPad / 16; ++step)
    ldmatrix_x4(a[step], rk_rows + (lane % 16) * (kRankPad + 8) + step * 16 + (lane / 16) * 8);
}

// The residual parts of 16 keys, first_key + r for r < 16, whose rK are rows r
// of rk_rows ([16][kRankPad + 8] bf16, zero past the rank); b is [kHeadDim][kRankPad + 8]
// (zero past the rank). For each value this lane holds, visit(t, h, r, d, low,
// high): key row r = g + 8 h, `low` the values at head dims (d, d + 1) with
// d = 8 t + 2 quad, `high` those at (d + kHeadDim / 2, d + 1 + kHeadDim / 2).
// Warp-wide (every lane calls it); t and h are compile-time after unrolling.
template <int kHeadDim, int kRankPad, typename Visit>
__device__ __forceinline__ void residual_keys(const float* inv_freq, const __nv_bfloat16* rk_rows,
                                              const __nv_bfloat16* b, float scale, int first_key, int lane,
                                              Visit&& visit) {
  constexpr int kRankStride = kRankPad + 8;
  constexpr int kHalf = kHeadDim / 2;
  constexpr int kRankSteps = kRankPad / 16;
  uint32_t a[kRankSteps][4];
  load_rank_fragments<kRankPad>(rk_rows, lane, a);
  const int g = lane / 4;
  const int quad = lane % 4;
#pragma unroll
  for (int t = 0; t < kHalf / 8; ++t) {
    float first[4] = {0.0f, 0.0f, 0.0f, 0.0f}, second[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int step = 0; step < kRankSteps; ++step) {
      uint32_t fragment[4];  // B rows d (matrices 0, 1) and d + kHalf (2, 3)
      ldmatrix_x4(fragment, b + (t * 8 + lane % 8 + (lane / 16) * kHalf) * kRankStride + step * 16 + ((lane / 8) % 2) * 8);
      mma_bf16(first, a[step], fragment[0], fragment[1]);
      mma_bf16(second, a[step], fragment[2], fragment[3]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = g + 8 * h;
      const int d = t * 8 + 2 * quad;
      float2 c, s;
      rope_cos_sin(inv_freq, first_key + r, d, c, s);
      const float x0 = first[2 * h] * scale, x1 = first[2 * h + 1] * scale;
      const float y0 = second[2 * h] * scale, y1 = second[2 * h + 1] * scale;
      visit(t, h, r, d, make_float2(x0 * c.x - y0 * s.x, x1 * c.y - y1 * s.y),
            make_float2(y0 * c.x + x0 * s.x, y1 * c.y + x1 * s.y));
    }
  }
}

// Prefill: warp w adds the residual parts of keys [16 w, 16 w + 16) of a tile
// to the tile's base keys in shared memory (k_tile [64][kHeadDim + 8], rk_tile
// [64][kRankPad + 8]); keys at or past kv_end stay as they are.
template <int kHeadDim, int kRankPad>
__device__ __forceinline__ void rebuild_keys(const float* inv_freq, __nv_bfloat16* k_tile, const __nv_bfloat16* rk_tile,
                                             const __nv_bfloat16* b, float scale, int tile_start, int kv_end, int warp,
                                             int lane) {
  constexpr int kStride = kHeadDim + 8;
  const int first_key = tile_start + warp * 16;
  residual_keys<kHeadDim, kRankPad>(
      inv_freq, rk_tile + warp * 16 * (kRankPad + 8), b, scale, first_key, lane,
      [&](int, int, int r, int d, float2 low, float2 high) {
        if (first_key + r >= kv_end) return;
        __nv_bfloat162* base_low = reinterpret_cast<__nv_bfloat162*>(k_tile + (warp * 16 + r) * kStride + d);
        __nv_bfloat162* base_high = reinterpret_cast<__nv_bfloat162*>(k_tile + (warp * 16 + r) * kStride + d + kHeadDim / 2);
        const float2 k_low = __bfloat1622float2(*base_low);
        const float2 k_high = __bfloat1622float2(*base_high);
        *base_low = __floats2bfloat162_rn(k_low.x + low.x, k_low.y + low.y);
        *base_high = __floats2bfloat162_rn(k_high.x + high.x, k_high.y + high.y);
      });
}

// Decode: a warp's 16 keys (first_key..) add Q · (residual part)^T to its two
// score tiles. The rebuilt keys never touch shared memory: packed to bf16, the
// C fragments of (keys x head_dim) are exactly the B fragments of S = Q K^T
// (key = the n index, head_dim = k). Keys past kv_end have rK = 0.
// Per pair of n-tiles (t, t + 1) the lane's low halves make score step t / 2 and
// the high halves step t / 2 + kHeadDim / 32, consumed at once (few live
// registers). s_k multiplies the residual scores, not the keys. RoPE: the SFU for
// the lane's key g; key g + 8 rotates that by 8 positions (rope: per pair of
// head dims {inv_freq d, d + 1, cos 8θ d, d + 1}, rope_sin: {sin 8θ d, d + 1}).
// Key g + 8's angle is then fl(θ p) + 8θ rather than qkv's fl(θ (p + 8)): they
// differ by the product's rounding, up to ~2e-3 rad at 32K positions, below half
// a bf16 ulp of the rebuilt key (the 32K decode test bounds the result).
template <int kHeadDim, int kRankPad>
__device__ __forceinline__ void add_residual_scores(const float* inv_freq, const float4* rope, const float2* rope_sin,
                                                    float (&score)[2][4], const uint32_t (&q)[kHeadDim / 16][4],
                                                    const __nv_bfloat16* rk_rows, const __nv_bfloat16* b, float scale,
                                                    int first_key, int lane) {
  if constexpr (kHeadDim < 32) {  // one n-tile a half: the old per-key form
    uint32_t keys[kHeadDim / 8][2];
    residual_keys<kHeadDim, kRankPad>(inv_freq, rk_rows, b, scale, first_key, lane,
                                      [&](int t, int h, int, int, float2 low, float2 high) {
                                        keys[t][h] = pack_bf16(low.x, low.y);
                                        keys[t + kHeadDim / 16][h] = pack_bf16(high.x, high.y);
                                      });
#pragma unroll
    for (int step = 0; step < kHeadDim / 16; ++step) {
      mma_bf16(score[0], q[step], keys[2 * step][0], keys[2 * step + 1][0]);
      mma_bf16(score[1], q[step], keys[2 * step][1], keys[2 * step + 1][1]);
    }
  } else {
    constexpr int kRankStride = kRankPad + 8;
    constexpr int kHalf = kHeadDim / 2;
    constexpr int kRankSteps = kRankPad / 16;
    uint32_t a[kRankSteps][4];
    load_rank_fragments<kRankPad>(rk_rows, lane, a);
    const int g = lane / 4;
    const int quad = lane % 4;
    const float position = static_cast<float>(first_key + g);
    float residual[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int j = 0; j < kHalf / 16; ++j) {
      uint32_t low[2][2], high[2][2];  // [t - 2 j][h]
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        const int t = 2 * j + u;
        float first[4] = {0.0f, 0.0f, 0.0f, 0.0f}, second[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int step = 0; step < kRankSteps; ++step) {
          uint32_t fragment[4];  // B rows d (matrices 0, 1) and d + kHalf (2, 3)
          ldmatrix_x4(fragment,
                      b + (t * 8 + lane % 8 + (lane / 16) * kHalf) * kRankStride + step * 16 + ((lane / 8) % 2) * 8);
          mma_bf16(first, a[step], fragment[0], fragment[1]);
          mma_bf16(second, a[step], fragment[2], fragment[3]);
        }
        const int pair = t * 4 + quad;  // head dims d = 2 pair, d + 1
        const float4 table = rope[pair];
        const float2 sin8 = rope_sin[pair];
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
      mma_bf16(residual[0], q[j], low[0][0], low[1][0]);
      mma_bf16(residual[1], q[j], low[0][1], low[1][1]);
      mma_bf16(residual[0], q[j + kHalf / 16], high[0][0], high[1][0]);
      mma_bf16(residual[1], q[j + kHalf / 16], high[0][1], high[1][1]);
    }
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) score[t][e] = fmaf(scale, residual[t][e], score[t][e]);
  }
}

}  // namespace loom::cuda
