#include "backend/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/skinny_gemm.h"
#include "util/error.h"

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

// X quantized once per gemm() call for its quantized outputs: one for block
// types, one (a view of X) for F16/BF16. The calling thread's copy (gemm() may
// run on several engine threads at once, one per backend) is handed to the
// team's threads by pointer.
struct QuantizedInputs {
  quant::QuantizedActivations int8;
  quant::QuantizedActivations half;
  const quant::QuantizedActivations& for_type(GgmlType type) const {
    return type == GgmlType::kF16 || type == GgmlType::kBF16 ? half : int8;
  }
};

thread_local QuantizedInputs quantized_inputs;
// X rounded as the int8 kernels see it, for block-type W on the sgemm path.
thread_local std::vector<float> rounded_x;

// y[rows, columns [begin, end)] = X W^T for quantized W over X rows
// [row_begin, row_end): int8 kernels for short X, else W's rows dequantized a
// slice at a time (a buffer of at most kDequantizedFloats per thread) and sgemm.
// For block types on the sgemm path x is already rounded (rounded_x) as the int8 kernels
// round it, so both paths compute the same function of the row.
void quantized_tile(const float* x, int64_t ldx, int64_t row_begin, int64_t row_end, const GemmOutput& output,
                    const quant::QuantizedActivations* activations, int64_t begin, int64_t end) {
  const quant::QuantizedMatrix& w = output.quantized;
  float* y = output.y + row_begin * output.ldy;
  if (activations != nullptr) {
    quant::quantized_matmul(w, *activations, row_begin, row_end, begin, end, y, output.ldy, quant::best_simd_level());
    return;
  }
  constexpr int64_t kDequantizedFloats = 256 * 1024;
  thread_local std::vector<float> dequantized;
  const int64_t k = w.row_length;
  const int64_t slice = std::max<int64_t>(16, kDequantizedFloats / k);
  dequantized.resize(static_cast<size_t>(slice * k));
  for (int64_t first = begin; first < end; first += slice) {
    const int64_t count = std::min(slice, end - first);
    dequantize_ggml(w.type, w.bytes + first * w.row_bytes, count * k, dequantized.data());
    gemm_on_this_thread(x + row_begin * ldx, ldx, row_end - row_begin, k, dequantized.data(), count, 1.0f, 0.0f,
                        y + first, output.ldy);
  }
}

// Rows [row_begin, row_end) x concatenated columns [column_begin, column_end).
void gemm_tile(const float* x, int64_t ldx, int64_t row_begin, int64_t row_end, int64_t k,
               std::span<const GemmOutput> outputs, int64_t column_begin, int64_t column_end, float alpha,
               float beta, const QuantizedInputs* inputs, const float* rounded_x_of_call) {
  int64_t offset = 0;
  for (const GemmOutput& output : outputs) {
    const int64_t begin = std::max(column_begin, offset) - offset;
    const int64_t end = std::min(column_end, offset + output.out_features) - offset;
    offset += output.out_features;
    if (begin >= end) continue;
    if (!output.quantized.empty()) {
      const bool is_half = output.quantized.type == GgmlType::kF16 || output.quantized.type == GgmlType::kBF16;
      const bool rounded = inputs == nullptr && !is_half;
      quantized_tile(rounded ? rounded_x_of_call : x, rounded ? k : ldx, row_begin, row_end, output,
                     inputs != nullptr ? &inputs->for_type(output.quantized.type) : nullptr, begin, end);
    }
    else
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

GemmOutput weight_output(const Tensor& weight, float* y, int64_t ldy, const float* bias) {
  LOOM_CHECK(weight.shape.size() == 2);
  GemmOutput output{weight.data, weight.shape[0], y, ldy, bias};
  if (weight.is_quantized())
    output.quantized = {static_cast<GgmlType>(weight.quantized.ggml_type), weight.quantized.bytes,
                        weight.quantized.row_bytes, weight.shape[0], weight.shape[1]};
  return output;
}

void gemm(const float* x, int64_t ldx, int64_t m, int64_t k, std::span<const GemmOutput> outputs,
          float alpha, float beta) {
  if (m == 0) return;
  int64_t num_columns = 0;
  bool has_int8 = false, has_half = false;
  for (const GemmOutput& output : outputs) {
    num_columns += output.out_features;
    if (output.quantized.empty()) continue;
    LOOM_CHECK(alpha == 1.0f && beta == 0.0f && output.quantized.row_length == k);
    const bool is_half = output.quantized.type == GgmlType::kF16 || output.quantized.type == GgmlType::kBF16;
    (is_half ? has_half : has_int8) = true;
  }
  const QuantizedInputs* inputs = m <= kMaxQuantizedKernelRows ? &quantized_inputs : nullptr;
  if (has_int8) quantized_inputs.int8.quantize(x, ldx, m, k, GgmlType::kQ8_0);
  if (inputs != nullptr && has_half) quantized_inputs.half.quantize(x, ldx, m, k, GgmlType::kF16);
  const float* rounded = nullptr;  // the sgemm path's X for block-type W (the calling thread's buffer)
  if (inputs == nullptr && has_int8) {
    rounded_x.resize(static_cast<size_t>(m * k));
    quantized_inputs.int8.dequantize(rounded_x.data());
    rounded = rounded_x.data();
  }
  const int num_threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (num_threads == 1 || m * num_columns * k < kMinMultiplyAddsForThreads) {
    gemm_tile(x, ldx, 0, m, k, outputs, 0, num_columns, alpha, beta, inputs, rounded);
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
                std::min(num_columns, column_begin + grid.column_block), alpha, beta, inputs, rounded);
    }
  }
}

}  // namespace loom::cpu
