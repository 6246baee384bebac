#include "cuda_model_test_util.h"

#include <algorithm>
#include <vector>

#include <gtest/gtest.h>

#include "cuda_test_util.h"
#include "synthetic/synthetic_weights.h"

namespace loom::cuda::test {

std::shared_ptr<ModelWeights> tiny_weights(const ModelConfig& config, uint64_t seed, bool bf16_matrices) {
  TensorMap tensors;
  for (const SyntheticTensorSpec& spec : synthetic_base_tensor_specs(config)) {
    Tensor tensor = make_synthetic_tensor(spec, seed);
    if (bf16_matrices && spec.shape.size() == 2) {
      std::vector<float> values(tensor.data, tensor.data + tensor.numel());
      tensor = Tensor::from_vector(spec.shape, round_to_bf16(std::move(values)));
    }
    tensors[spec.name] = tensor;
  }
  return std::make_shared<ModelWeights>(build_model_weights(config, tensors, "synthetic tiny"));
}

std::shared_ptr<const LoraAdapter> rounded_adapter(const LoraAdapter& adapter) {
  auto copy = std::make_shared<LoraAdapter>(adapter);
  for (auto& layer : copy->layers)
    for (auto& module : layer) {
      if (!module.has_value()) continue;
      for (Tensor* tensor : {&module->a, &module->b}) {
        std::vector<float> values(tensor->data, tensor->data + tensor->numel());
        *tensor = Tensor::from_vector(tensor->shape, round_to_bf16(std::move(values)));
      }
    }
  return copy;
}

int argmax(const float* row, int count) { return static_cast<int>(std::max_element(row, row + count) - row); }

void expect_logits_close(const ForwardResult& out, const ForwardResult& ref, const std::string& what, double max_nmse,
                         double* worst_nmse) {
  ASSERT_EQ(out.logit_token_index, ref.logit_token_index) << what;
  ASSERT_EQ(out.logits.size(), ref.logits.size()) << what;
  const Closeness c = compare(out.logits, ref.logits);
  if (worst_nmse != nullptr) *worst_nmse = std::max(*worst_nmse, c.nmse);
  EXPECT_FALSE(c.has_nan) << what;
  EXPECT_LE(c.nmse, max_nmse) << what << ": " << c.describe();
  const int vocab = ref.vocab_size;
  for (size_t r = 0; r < ref.logit_token_index.size(); ++r) {
    const float* ref_row = ref.logits.data() + r * vocab;
    const int expected = argmax(ref_row, vocab);
    const int got = argmax(out.logits.data() + r * vocab, vocab);
    if (got == expected) continue;
    EXPECT_LT(ref_row[expected] - ref_row[got], kNearTie) << what << " row " << r << ": argmax " << got << " vs " << expected;
  }
}

}  // namespace loom::cuda::test
