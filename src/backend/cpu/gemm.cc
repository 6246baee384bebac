#include "backend/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>

#include "backend/cpu/skinny_gemm.h"

namespace loom::cpu {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Below this many multiply-adds the parallel region costs more than it saves.
constexpr int64_t kMinMultiplyAddsForThreads = 256 * 1024;

void gemm_on_this_thread(const float* x, int64_t ldx, int64_t m, int64_t k, const float* w, int64_t n,
                         float alpha, float beta, float* y, int64_t ldy) {
  if (m == 0 || n == 0) return;
  if (m <= kMaxSkinnyRows) {
    skinny_gemm(x, ldx, m, k, w, n, alpha, beta, y, ldy);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, x, static_cast<int>(ldx), w, static_cast<int>(k), beta, y,
              static_cast<int>(ldy));
}

// Rows [row_begin, row_end) x concatenated columns [column_begin, column_end).
void gemm_tile(const float* x, int64_t ldx, int64_t row_begin, int64_t row_end, int64_t k,
               std::span<const GemmOutput> outputs, int64_t column_begin, int64_t column_end, float alpha,
               float beta) {
  int64_t offset = 0;
  for (const GemmOutput& output : outputs) {
    const int64_t begin = std::max(column_begin, offset) - offset;
    const int64_t end = std::min(column_end, offset + output.out_features) - offset;
    offset += output.out_features;
    if (begin >= end) continue;
    gemm_on_this_thread(x + row_begin * ldx, ldx, row_end - row_begin, k, output.weight + begin * k,
                        end - begin, alpha, beta, output.y + row_begin * output.ldy + begin, output.ldy);
    if (output.bias == nullptr) continue;
    for (int64_t row = row_begin; row < row_end; ++row) {
      float* y_row = output.y + row * output.ldy;
#pragma omp simd
      for (int64_t column = begin; column < end; ++column) y_row[column] += output.bias[column];
    }
  }
}

struct Grid {
  int64_t row_block = 0;     // rows per tile
  int64_t column_block = 0;  // concatenated columns per tile
  int64_t num_row_blocks = 0;
  int64_t num_column_blocks = 0;
  int64_t num_tiles() const { return num_row_blocks * num_column_blocks; }
};

// The tiling of at most num_threads tiles whose smaller side is largest:
// OpenBLAS packs both operands per call, so square-ish tiles waste least.
Grid choose_grid(int64_t m, int64_t num_columns, int num_threads) {
  // Whole SIMD micro-tiles of OpenBLAS's sgemm kernels; the skinny kernel needs none.
  const int64_t alignment = m <= kMaxSkinnyRows ? 4 : 16;
  Grid best;
  int64_t best_side = -1;
  for (int64_t row_splits = 1; row_splits <= num_threads; ++row_splits) {
    const int64_t column_splits = num_threads / row_splits;
    Grid grid;
    grid.row_block = ceil_div(m, row_splits);
    grid.column_block = ceil_div(ceil_div(num_columns, column_splits), alignment) * alignment;
    grid.num_row_blocks = ceil_div(m, grid.row_block);
    grid.num_column_blocks = ceil_div(num_columns, grid.column_block);
    const int64_t side = std::min(grid.row_block, grid.column_block);
    if (side > best_side || (side == best_side && grid.num_tiles() > best.num_tiles())) {
      best = grid;
      best_side = side;
    }
  }
  return best;
}

}  // namespace

void gemm(const float* x, int64_t ldx, int64_t m, int64_t k, std::span<const GemmOutput> outputs,
          float alpha, float beta) {
  if (m == 0) return;
  int64_t num_columns = 0;
  for (const GemmOutput& output : outputs) num_columns += output.out_features;
  const int num_threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (num_threads == 1 || m * num_columns * k < kMinMultiplyAddsForThreads) {
    gemm_tile(x, ldx, 0, m, k, outputs, 0, num_columns, alpha, beta);
    return;
  }
  const Grid grid = choose_grid(m, num_columns, num_threads);
  // Always the whole team, idle threads included: a team size that changes from
  // one region to the next parks libgomp threads and wakes them again, which
  // cost the attention region after it tens of microseconds per layer.
#pragma omp parallel num_threads(num_threads)
  {
    const int64_t tile = omp_get_thread_num();
    if (tile < grid.num_tiles()) {
      const int64_t row_begin = (tile / grid.num_column_blocks) * grid.row_block;
      const int64_t column_begin = (tile % grid.num_column_blocks) * grid.column_block;
      gemm_tile(x, ldx, row_begin, std::min(m, row_begin + grid.row_block), k, outputs, column_begin,
                std::min(num_columns, column_begin + grid.column_block), alpha, beta);
    }
  }
}

}  // namespace loom::cpu
