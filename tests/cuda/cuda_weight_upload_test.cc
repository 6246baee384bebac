// Weights streamed to the GPU in their stored format (backend/cuda/weight_upload.h):
// BF16 rows copied as they are, F16 and fp32 converted on the device, GGUF
// blocks dequantized chunk by chunk, each landing exactly where the fp32 path
// put it; tensors larger than one chunk; and end to end, a bf16 / f16
// checkpoint kept in its file mapping gives the logits of its fp32 expansion.
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/weight_upload.h"
#include "cuda_model_test_util.h"
#include "cuda_test_util.h"
#include "formats/gguf_dequant.h"
#include "formats/safetensors.h"
#include "model/weights.h"
#include "reference_model.h"
#include "synthetic/synthetic_model.h"
#include "test_util.h"
#include "util/half.h"
#include "util/prng.h"

// Batch inputs are filled with designated initializers, leaving defaults out on purpose.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace loom::cuda {
namespace {

std::vector<float> random_values(int64_t count, uint64_t seed) {
  Prng prng(seed);
  std::vector<float> values(count);
  for (float& value : values) value = 3.0f * prng.next_symmetric_float();
  return values;
}

// Rows of 16-bit values (as a checkpoint keeps them) viewed as Tensor::quantized.
Tensor sixteen_bit_rows(const std::vector<float>& values, int64_t rows, GgmlType type,
                        std::vector<uint16_t>& storage) {
  storage.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i)
    storage[i] = type == GgmlType::kBF16 ? float_to_bf16(values[i]) : float_to_fp16(values[i]);
  Tensor tensor;
  tensor.shape = {rows, static_cast<int64_t>(values.size()) / rows};
  tensor.quantized = {static_cast<uint32_t>(type), reinterpret_cast<const uint8_t*>(storage.data()),
                      tensor.shape[1] * 2};
  return tensor;
}

// Q8_0 rows: blocks of 32 int8 values with one fp16 scale.
Tensor q8_0_rows(const std::vector<float>& values, int64_t rows, std::vector<uint8_t>& storage) {
  const int64_t columns = static_cast<int64_t>(values.size()) / rows;
  const int64_t row_bytes = columns / 32 * 34;
  storage.assign(rows * row_bytes, 0);
  for (int64_t block = 0; block < static_cast<int64_t>(values.size()) / 32; ++block) {
    float largest = 0.0f;
    for (int i = 0; i < 32; ++i) largest = std::max(largest, std::abs(values[block * 32 + i]));
    const float scale = largest / 127.0f;
    uint8_t* out = storage.data() + block * 34;
    const uint16_t scale_bits = float_to_fp16(scale);
    std::memcpy(out, &scale_bits, 2);
    for (int i = 0; i < 32; ++i)
      out[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(values[block * 32 + i] / std::max(scale, 1e-30f))));
  }
  Tensor tensor;
  tensor.shape = {rows, columns};
  tensor.quantized = {static_cast<uint32_t>(GgmlType::kQ8_0), storage.data(), row_bytes};
  return tensor;
}

std::vector<uint16_t> download_bf16(const DeviceBuffer& buffer, int64_t count) {
  std::vector<uint16_t> values(count);
  LOOM_CUDA_CHECK(cudaMemcpy(values.data(), buffer.data(), count * 2, cudaMemcpyDeviceToHost));
  return values;
}

// Every format lands as the host's fp32 expansion rounded to bf16 would, over
// tensors of several chunks (a chunk is 32 MiB of staging).
TEST(CudaWeightUpload, EveryStoredFormatLandsAsItsFp32ExpansionWould) {
  LOOM_REQUIRE_GPU();
  const int64_t rows = 5000, columns = 4096;  // 20.5M values: 3 fp32 chunks, 2 16-bit ones
  const std::vector<float> values = random_values(rows * columns, 7);
  std::vector<uint16_t> bf16_storage, f16_storage;
  std::vector<uint8_t> q8_storage;
  const Tensor fp32 = Tensor::from_vector({rows, columns}, values);
  const Tensor bf16 = sixteen_bit_rows(values, rows, GgmlType::kBF16, bf16_storage);
  const Tensor f16 = sixteen_bit_rows(values, rows, GgmlType::kF16, f16_storage);
  const Tensor q8 = q8_0_rows(values, rows, q8_storage);
  const Tensor small_norm = Tensor::from_vector({columns}, random_values(columns, 8));

  std::vector<DeviceBuffer> buffers;
  for (int i = 0; i < 5; ++i) buffers.emplace_back(rows * columns * 4);
  const std::vector<WeightUpload> uploads = {{"fp32", &fp32, buffers[0].data(), true},
                                             {"bf16", &bf16, buffers[1].data(), true},
                                             {"f16", &f16, buffers[2].data(), true},
                                             {"q8_0", &q8, buffers[3].data(), true},
                                             {"norm", &small_norm, buffers[4].data(), false}};
  const WeightUploadStats stats = upload_weights(uploads, 0);
  EXPECT_GE(stats.num_workers, 1);

  auto expected_bf16 = [&](const Tensor& tensor) {
    const Tensor expanded = to_fp32(tensor);
    std::vector<uint16_t> bits(expanded.numel());
    for (int64_t i = 0; i < expanded.numel(); ++i) bits[i] = float_to_bf16(expanded.data[i]);
    return bits;
  };
  EXPECT_EQ(download_bf16(buffers[0], rows * columns), expected_bf16(fp32));
  EXPECT_EQ(download_bf16(buffers[1], rows * columns), bf16_storage);  // copied as it is
  EXPECT_EQ(download_bf16(buffers[2], rows * columns), expected_bf16(f16));
  EXPECT_EQ(download_bf16(buffers[3], rows * columns), expected_bf16(q8));
  std::vector<float> norm(columns);
  LOOM_CUDA_CHECK(cudaMemcpy(norm.data(), buffers[4].data(), columns * 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(0, std::memcmp(norm.data(), small_norm.data, columns * 4));

  // A missing tensor is named.
  const Tensor missing;
  const std::vector<WeightUpload> bad = {{"model.layers.3.mlp.up_proj.weight", &missing, buffers[0].data(), true}};
  loom::test::expect_error([&] { upload_weights(bad, 0); }, ErrorKind::kFormat, {"model.layers.3.mlp.up_proj.weight"});
}

// A bf16 (and an f16) checkpoint served from its file mapping gives exactly the
// logits of the same file expanded to fp32 on the host first.
TEST(CudaWeightUpload, SixteenBitCheckpointsKeptInTheirFileGiveTheFp32PathsLogits) {
  LOOM_REQUIRE_GPU();
  const ModelConfig config = synthetic_model_config(Architecture::kQwen2, SyntheticPreset::kTiny);
  const auto weights = loom::test::random_weights(config, 21);
  const TensorMap tensors = model_weights_to_tensor_map(config, *weights);
  loom::test::TempDir directory;
  for (const StoredDtype dtype : {StoredDtype::kBF16, StoredDtype::kF16}) {
    const std::string path = directory.str() + "/model.safetensors";
    write_safetensors(path, tensors, dtype);
    const ModelWeights expanded = build_model_weights(config, read_safetensors(path), path);
    const ModelWeights kept = build_model_weights(config, read_safetensors(path, {.keep_16bit = true}), path);
    ASSERT_TRUE(has_quantized_tensors(kept));
    auto from_expanded = make_cuda_backend(config, expanded);
    auto from_kept = make_cuda_backend(config, kept);
    from_expanded->allocate_kv_cache({16, 16});
    from_kept->allocate_kv_cache({16, 16});
    const Batch batch = loom::test::make_batch(
        {{.tokens = loom::test::random_tokens(3, 40, config.vocab_size), .block_ids = {0, 1, 2},
          .logits_for_all_tokens = true}});
    const ForwardResult a = from_expanded->forward(batch);
    const ForwardResult b = from_kept->forward(batch);
    ASSERT_EQ(a.logits.size(), b.logits.size());
    EXPECT_EQ(0, std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)))
        << (dtype == StoredDtype::kBF16 ? "bf16" : "f16");
  }
}

}  // namespace
}  // namespace loom::cuda
