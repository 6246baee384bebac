// FP8 weights (--quantization fp8): the per-tensor quantizer, the FP8 skinny
// GEMM (decode) and the dequantizer (larger steps) against host references
// over the dequantized values, and a model with FP8 weights against its bf16
// self (the same weights before quantization).
#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "cuda_model_test_util.h"
#include "cuda_test_util.h"
#include "synthetic/synthetic_model.h"

namespace loom::cuda {
namespace {

using test::random_values;
using test::upload_bf16;

// e4m3 (1 sign, 4 exponent bits biased by 7, 3 mantissa bits; no infinities).
float e4m3_to_float(uint8_t bits) {
  const int sign = bits >> 7, exponent = (bits >> 3) & 15, mantissa = bits & 7;
  if (exponent == 15 && mantissa == 7) return NAN;
  const float magnitude = exponent == 0 ? std::ldexp(mantissa / 8.0f, -6) : std::ldexp(1.0f + mantissa / 8.0f, exponent - 7);
  return sign ? -magnitude : magnitude;
}

struct Quantized {
  DeviceBuffer data, scale;
  std::vector<float> values;  // dequantized: e4m3 * scale
  float host_scale = 0.0f;
};

Quantized quantize(const DeviceBuffer& x, int64_t rows, int64_t cols) {
  Quantized q;
  q.data.allocate(rows * cols);
  q.scale.allocate(sizeof(float));
  DeviceBuffer amax(sizeof(uint32_t));
  launch_fp8_quantize(x.as<bf16>(), rows, cols, cols, q.data.as<uint8_t>(), q.scale.as<float>(), amax.as<uint32_t>(),
                      nullptr);
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> bytes(rows * cols);
  LOOM_CUDA_CHECK(cudaMemcpy(bytes.data(), q.data.data(), bytes.size(), cudaMemcpyDeviceToHost));
  LOOM_CUDA_CHECK(cudaMemcpy(&q.host_scale, q.scale.data(), sizeof(float), cudaMemcpyDeviceToHost));
  for (uint8_t b : bytes) q.values.push_back(e4m3_to_float(b) * q.host_scale);
  return q;
}

// y[r, c] = sum_k x[r, k] w[c, k] in double, and sum |x| |w| (the scale an fp32 sum's error follows).
void reference(const std::vector<float>& x, const std::vector<float>& w, int m, int n, int k, std::vector<double>& y,
               std::vector<double>& magnitude) {
  y.assign(m * n, 0.0);
  magnitude.assign(m * n, 0.0);
  for (int r = 0; r < m; ++r)
    for (int c = 0; c < n; ++c)
      for (int i = 0; i < k; ++i) {
        y[r * n + c] += static_cast<double>(x[r * k + i]) * w[c * k + i];
        magnitude[r * n + c] += std::fabs(static_cast<double>(x[r * k + i]) * w[c * k + i]);
      }
}

TEST(CudaFp8, QuantizerAndSkinnyGemmEqualTheDequantizedWeights) {
  LOOM_REQUIRE_GPU();
  struct Shape { int n, k; };
  for (Shape shape : {Shape{300, 576}, Shape{97, 4112}, Shape{64, 16}}) {
    SCOPED_TRACE("n " + std::to_string(shape.n) + " k " + std::to_string(shape.k));
    Prng prng(shape.k);
    const std::vector<float> w = random_values(prng, shape.n * shape.k, 0.05f);
    const DeviceBuffer w_d = upload_bf16(w);
    const Quantized q = quantize(w_d, shape.n, shape.k);
    float amax = 0.0f;
    for (float v : w) amax = std::max(amax, std::fabs(v));
    EXPECT_FLOAT_EQ(q.host_scale, amax / kFp8E4m3Max);
    for (size_t i = 0; i < w.size(); ++i)  // round to nearest: half of e4m3's 2^-3 step, or of its subnormal step
      ASSERT_LE(std::fabs(q.values[i] - w[i]), std::fabs(w[i]) / 16 + q.host_scale * std::ldexp(1.0f, -10)) << i;
    for (int m = 1; m <= kSkinnyGemmMaxRows; ++m) {
      const std::vector<float> x = random_values(prng, m * shape.k, 1.0f);
      std::vector<double> expected, magnitude;
      reference(x, q.values, m, shape.n, shape.k, expected, magnitude);
      const DeviceBuffer x_d = upload_bf16(x);
      DeviceBuffer y_d(m * shape.n * sizeof(float));
      launch_skinny_gemm_fp8(x_d.as<bf16>(), m, shape.k, q.data.as<uint8_t>(), q.scale.as<float>(), shape.n, shape.k,
                             y_d.data(), false, shape.n, nullptr);
      const std::vector<float> y = test::download_f32(y_d.data(), m * shape.n);
      for (int i = 0; i < m * shape.n; ++i)
        ASSERT_NEAR(y[i], expected[i], 1e-5 * magnitude[i] + 1e-6) << "m " << m << " at " << i;
    }
  }
}

TEST(CudaFp8, DequantizeGivesTheQuantizedValuesInBf16) {
  LOOM_REQUIRE_GPU();
  const int rows = 37, cols = 576;
  Prng prng(5);
  const std::vector<float> w = random_values(prng, rows * cols, 0.05f);
  const DeviceBuffer w_d = upload_bf16(w);
  const Quantized q = quantize(w_d, rows, cols);
  DeviceBuffer out(rows * cols * sizeof(bf16));
  launch_fp8_dequantize(q.data.as<uint8_t>(), q.scale.as<float>(), rows * cols, out.as<bf16>(), nullptr);
  const std::vector<float> got = test::download_bf16(out.data(), rows * cols);
  for (int i = 0; i < rows * cols; ++i) ASSERT_EQ(got[i], test::round_to_bf16(q.values[i])) << i;
}

// The tiny model with FP8 weights against the same synthetic weights in bf16:
// a prefill (dequantized weights) and decode steps (the FP8 skinny GEMM) stay
// near, the weights take less memory, and replayed decode graphs equal eager steps.
TEST(CudaFp8, ModelNearItsBf16SelfAndGraphsEqualEager) {
  LOOM_REQUIRE_GPU();
  const ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  CudaBackendConfig fp8_config;
  fp8_config.fp8_weights = true;
  CudaBackendConfig eager_config = fp8_config;
  eager_config.tuning.cuda_graphs = false;
  auto bf16_backend = make_synthetic_cuda_backend_impl(config, 41, false, {});
  auto fp8_backend = make_synthetic_cuda_backend_impl(config, 41, false, fp8_config);
  auto eager_backend = make_synthetic_cuda_backend_impl(config, 41, false, eager_config);
  EXPECT_TRUE(fp8_backend->model().fp8());
  EXPECT_FALSE(bf16_backend->model().fp8());
  EXPECT_LT(fp8_backend->model().weight_bytes(), bf16_backend->model().weight_bytes());
  constexpr int kBlocks = 64, kBlockSize = 16;
  for (Backend* backend : {static_cast<Backend*>(bf16_backend.get()), static_cast<Backend*>(fp8_backend.get()),
                           static_cast<Backend*>(eager_backend.get())})
    backend->allocate_kv_cache({kBlocks, kBlockSize});
  test::Driver driver(kBlocks, kBlockSize, 3);
  const int a = driver.add_sequence(), b = driver.add_sequence();
  std::vector<Batch> steps = {driver.make_batch({{a, driver.random_tokens(40, config.vocab_size), std::vector<int32_t>(40, -1), true},
                                                 {b, driver.random_tokens(23, config.vocab_size), std::vector<int32_t>(23, -1), false}})};
  for (int step = 0; step < 4; ++step)
    steps.push_back(driver.make_batch({{a, driver.random_tokens(1, config.vocab_size), {-1}, false},
                                       {b, driver.random_tokens(1, config.vocab_size), {-1}, false}}));
  double worst = 0.0;
  for (size_t s = 0; s < steps.size(); ++s) {
    const ForwardResult reference = bf16_backend->forward(steps[s]);
    const ForwardResult fp8 = fp8_backend->forward(steps[s]);
    const ForwardResult eager = eager_backend->forward(steps[s]);
    double error = 0, norm = 0;
    for (size_t i = 0; i < reference.logits.size(); ++i) {
      error += (fp8.logits[i] - reference.logits[i]) * (fp8.logits[i] - reference.logits[i]);
      norm += reference.logits[i] * reference.logits[i];
    }
    worst = std::max(worst, error / norm);
    if (s > 0) {
      EXPECT_EQ(fp8.logits, eager.logits) << "decode step " << s << ": graph replay against eager";
    }
  }
  std::printf("[ fp8 ] tiny llama, FP8 weights against bf16: worst logits NMSE %.3g over %zu steps\n", worst,
              steps.size());
  EXPECT_LT(worst, 0.05);
  EXPECT_GT(fp8_backend->graph_stats().replays, 0);
}

}  // namespace
}  // namespace loom::cuda
