#include "formats/tensor.h"

#include <algorithm>

#include "formats/gguf_dequant.h"
#include "util/error.h"

namespace loom {

Tensor Tensor::from_vector(std::vector<int64_t> shape, std::vector<float> values) {
  Tensor tensor;
  tensor.shape = std::move(shape);
  LOOM_CHECK(tensor.numel() == static_cast<int64_t>(values.size()));
  auto owned = std::make_shared<std::vector<float>>(std::move(values));
  tensor.data = owned->data();
  tensor.storage = std::move(owned);
  return tensor;
}

Tensor to_fp32(const Tensor& tensor) {
  if (!tensor.is_quantized()) return tensor;
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
