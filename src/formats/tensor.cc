#include "formats/tensor.h"

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

}  // namespace loom
