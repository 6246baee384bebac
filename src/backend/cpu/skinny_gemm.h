// Y = alpha * X W^T + beta * Y for X of at most kMaxSkinnyRows rows (decode
// steps), on the calling thread, AVX2/FMA.
//
// Why not OpenBLAS: with W streamed from memory (the decode case: weights do not
// fit in cache), its sgemm packs W panel by panel and reaches ~1/4 of the
// bandwidth its sgemv does, and calling sgemv once per row re-reads W. This
// kernel reads each row of W once and multiplies it with all rows of X (which
// sit in L1), so a step of 8 tokens costs about what a step of 1 does.
#pragma once

#include <cstdint>

namespace loom::cpu {

inline constexpr int64_t kMaxSkinnyRows = 8;

// X [m, k] rows ldx apart, W [n, k] row-major, Y [m, n] rows ldy apart;
// 1 <= m <= kMaxSkinnyRows. beta is 0 (Y overwritten, never read) or 1.
void skinny_gemm(const float* x, int64_t ldx, int64_t m, int64_t k, const float* w, int64_t n,
                 float alpha, float beta, float* y, int64_t ldy);

}  // namespace loom::cpu
