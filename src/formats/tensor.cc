#include "formats/tensor.h"

#include <algorithm>
#include <array>

#include "formats/gguf_dequant.h"
#include "util/error.h"
#include "util/fp8.h"

namespace loom {

namespace {

// Every e4m3 value, for dequantizing whole matrices.
const std::array<float, 256>& e4m3_values() {
  static const std::array<float, 256> values = [] {
    std::array<float, 256> table{};
    for (int bits = 0; bits < 256; ++bits) table[bits] = e4m3_to_float(static_cast<uint8_t>(bits));
    return table;
  }();
  return values;
}

Tensor fp8_to_fp32(const Tensor& tensor) {
  LOOM_CHECK(tensor.shape.size() == 2);
  const int64_t rows = tensor.shape[0];
  const int64_t columns = tensor.shape[1];
  const std::array<float, 256>& table = e4m3_values();
  const QuantizedRows& source = tensor.quantized;
  std::vector<float> values(static_cast<size_t>(rows * columns));
  int64_t bad_row = -1;
#pragma omp parallel for schedule(static) if (rows * columns > (1 << 20))
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = source.bytes + r * source.row_bytes;
    const float scale = source.fp8.rows != nullptr ? source.fp8.rows[r] : 1.0f;
    float* out = values.data() + r * columns;
    bool nan = false;
    for (int64_t c = 0; c < columns; ++c) {
      nan |= e4m3_is_nan(row[c]);
      out[c] = table[row[c]] * scale;
    }
    if (nan) {
#pragma omp critical(loom_fp8_bad_row)
      if (bad_row < 0 || r < bad_row) bad_row = r;
    }
  }
  if (bad_row >= 0)
    fail(ErrorKind::kFormat, "an F8_E4M3 tensor of shape [{}, {}] holds NaN (0x7F / 0xFF) in row {}", rows,
         columns, bad_row);
  return Tensor::from_vector(tensor.shape, std::move(values));
}

}  // namespace

Tensor Tensor::from_vector(std::vector<int64_t> shape, std::vector<float> values) {
  Tensor tensor;
  tensor.shape = std::move(shape);
  LOOM_CHECK(tensor.numel() == static_cast<int64_t>(values.size()));
  auto owned = std::make_shared<std::vector<float>>(std::move(values));
  tensor.data = owned->data();
  tensor.storage = std::move(owned);
  return tensor;
}

Tensor Tensor::scalar(float value) {
  Tensor tensor;
  auto owned = std::make_shared<std::vector<float>>(1, value);
  tensor.data = owned->data();
  tensor.storage = std::move(owned);
  return tensor;
}

Tensor to_fp32(const Tensor& tensor) {
  if (!tensor.is_quantized()) return tensor;
  if (tensor.is_fp8()) return fp8_to_fp32(tensor);
  std::vector<float> values(static_cast<size_t>(tensor.numel()));
  const auto type = static_cast<GgmlType>(tensor.quantized.ggml_type);
  const int64_t rows = tensor.shape.size() == 2 ? tensor.shape[0] : 1;
  const int64_t row_length = tensor.numel() / std::max<int64_t>(rows, 1);
  if (rows <= 1 || tensor.quantized.row_bytes == ggml_row_bytes(type, row_length)) {
    dequantize_ggml(type, tensor.quantized.bytes, tensor.numel(), values.data());
  } else {  // strided rows (a column slice)
    for (int64_t r = 0; r < rows; ++r)
      dequantize_ggml(type, tensor.quantized.bytes + r * tensor.quantized.row_bytes, row_length,
                      values.data() + r * row_length);
  }
  return Tensor::from_vector(tensor.shape, std::move(values));
}

}  // namespace loom
