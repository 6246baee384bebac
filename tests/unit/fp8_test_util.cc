#include "fp8_test_util.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "util/fp8.h"

namespace loom::test {

Fp8Linear quantize_fp8_linear(const Tensor& weight, bool per_channel, const std::function<float(float)>& round_scale) {
  const int64_t rows = weight.shape[0], columns = weight.shape[1];
  Fp8Linear out;
  out.scales.resize(rows);
  float tensor_max = 0.0f;
  for (int64_t i = 0; i < rows * columns; ++i) tensor_max = std::max(tensor_max, std::fabs(weight.data[i]));
  for (int64_t r = 0; r < rows; ++r) {
    float row_max = 0.0f;
    for (int64_t c = 0; c < columns; ++c) row_max = std::max(row_max, std::fabs(weight.data[r * columns + c]));
    out.scales[r] = round_scale((per_channel ? row_max : tensor_max) / kE4M3Max);
  }
  auto bytes = std::make_shared<std::vector<uint8_t>>(rows * columns);
  out.dequantized.resize(rows * columns);
  for (int64_t i = 0; i < rows * columns; ++i) {
    const float scale = out.scales[i / columns];
    (*bytes)[i] = float_to_e4m3(weight.data[i] / scale);
    out.dequantized[i] = e4m3_to_float((*bytes)[i]) * scale;
  }
  out.rows.shape = weight.shape;
  out.rows.quantized.ggml_type = kF8E4M3RowType;
  out.rows.quantized.bytes = bytes->data();
  out.rows.quantized.row_bytes = columns;
  out.rows.storage = bytes;
  return out;
}

}  // namespace loom::test
