// Y = X W^T with W kept in its GGUF block format (formats/gguf_dequant.h):
// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, and F16/BF16 rows.
//
// How: X's rows are quantized once per product to int8 in blocks of 32 with one
// fp32 scale each (QuantizedActivations, as ggml-cpu's Q8 activations), so a
// block of W meets a block of X in an integer dot product; each block's result
// is scaled in fp32. The K-quants are read as 32-element sub-blocks with their
// own scale (and min), so every type shares the same activation blocks.
// F16/BF16 rows multiply the fp32 X directly (no activation rounding).
//
// Error against dequantize-then-fp32: rounding x to d * round(x / d), with
// d = max|x over its block| / 127, moves each x by at most d / 2, so
//   |y - y_ref| <= sum_i |w_i| * d(block of i) / 2   (+ fp32 summation error)
// (tests/unit/quantized_matmul_test.cc checks exactly this bound).
//
// SIMD: kScalar (portable C++), kAvx2 (AVX2 + FMA + F16C, the build's floor) and
// kAvx512 (AVX-512 F/BW/VL + VNNI, compiled with target attributes, used only
// where the CPU has them). best_simd_level() picks once per process; tests
// run each level against the same reference.
//
// Threads: the kernels run on the calling thread; cpu/gemm.h splits columns
// (and rows) across the OpenMP team.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/gguf_dequant.h"

namespace loom::cpu::quant {

enum class SimdLevel { kScalar, kAvx2, kAvx512 };

// The widest level this CPU runs (cached after the first call).
SimdLevel best_simd_level();
bool is_simd_level_supported(SimdLevel level);
const char* simd_level_name(SimdLevel level);

// Whether the kernels take W of this type.
bool is_quantized_matmul_type(GgmlType type);
// Throws Error(kUnsupported) naming the type and `what` (a tensor name) when they do not.
void check_quantized_matmul_type(uint32_t ggml_type, const std::string& what);

// W: num_rows rows of row_length elements, row_bytes apart, in `type`'s block
// format. A view: the bytes belong to the model's weights.
struct QuantizedMatrix {
  GgmlType type = GgmlType::kF32;
  const uint8_t* bytes = nullptr;
  int64_t row_bytes = 0;
  int64_t num_rows = 0;    // out_features
  int64_t row_length = 0;  // in_features, a multiple of the type's block size

  bool empty() const { return bytes == nullptr; }
};

// X [num_rows, row_length] as the kernels read it. For block types, per row:
// int8 values[row_length], and per block of 32 the scale d and d * sum(values)
// (the term a block's min or offset multiplies). For F16/BF16 W: a view of X.
//
// Invariant after quantize(): values of row r lie in [-127, 127] (so the
// kernels' sign trick cannot overflow) and x[r][i] ~= d[r][i / 32] * values[r][i].
// Ownership: owns its buffers (reused across calls); x must outlive the view
// when it holds one.
class QuantizedActivations {
 public:
  // Reads x (rows ldx floats apart). `for_type` decides the layout; row_length
  // must be a multiple of 32 for block types. Runs with OpenMP threads when
  // large and not inside a parallel region.
  void quantize(const float* x, int64_t ldx, int64_t num_rows, int64_t row_length, GgmlType for_type);

  int64_t num_rows() const { return num_rows_; }
  int64_t row_length() const { return row_length_; }
  int64_t num_blocks() const { return row_length_ / 32; }
  bool is_int8() const { return is_int8_; }
  const int8_t* values(int64_t row) const { return values_.data() + row * row_length_; }
  const float* scales(int64_t row) const { return scales_.data() + row * num_blocks(); }
  const float* scaled_sums(int64_t row) const { return scaled_sums_.data() + row * num_blocks(); }
  const float* fp32(int64_t row) const { return x_ + row * ldx_; }
  // Block types: X as the int8 kernels see it, d * values, into out [num_rows][row_length]
  // (the dequantize + sgemm path of tall products uses it, so that a row's result does
  // not depend on how many rows share its product).
  void dequantize(float* out) const;

 private:
  int64_t num_rows_ = 0;
  int64_t row_length_ = 0;
  bool is_int8_ = false;
  std::vector<int8_t> values_;
  std::vector<float> scales_;
  std::vector<float> scaled_sums_;
  const float* x_ = nullptr;
  int64_t ldx_ = 0;
};

// Rows per kernel call: rows beyond it are done in chunks of this many.
inline constexpr int64_t kMaxRowsPerKernel = 8;

// y[r * ldy + c] = sum_i x[r][i] * W[c][i] for activation rows r in
// [row_begin, row_end) (y's row 0 is row_begin) and W rows (output columns) c in
// [column_begin, column_end) (y points at column 0). `x` was quantized for
// w.type with w.row_length. Overwrites y (never reads it).
void quantized_matmul(const QuantizedMatrix& w, const QuantizedActivations& x, int64_t row_begin,
                      int64_t row_end, int64_t column_begin, int64_t column_end, float* y, int64_t ldy,
                      SimdLevel level);

}  // namespace loom::cpu::quant
