#include "formats/tensor.h"

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
  dequantize_ggml(static_cast<GgmlType>(tensor.quantized.ggml_type), tensor.quantized.bytes, tensor.numel(),
                  values.data());
  return Tensor::from_vector(tensor.shape, std::move(values));
}

}  // namespace loom
