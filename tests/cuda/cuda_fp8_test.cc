// FP8 weights (--quantization fp8): the per-row quantizer, the FP8 skinny GEMM
// (decode), cuBLASLt's FP8 GEMM over per-token quantized activations (larger
// steps) and the dequantizer (shapes it refuses) against host references over
// the dequantized values, and a model with FP8 weights against its bf16 self
// (the same weights before quantization).
#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "cuda_model_test_util.h"
#include "cuda_test_util.h"
#include "fp8_test_util.h"
#include "model/quantization.h"
#include "synthetic/synthetic_model.h"
#include "util/fp8.h"

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
  DeviceBuffer data, scales;
  std::vector<float> values;       // dequantized: e4m3 * the row's scale
  std::vector<float> host_scales;  // one per row
};

// Per row (per_tensor false) or one scale for all, repeated for every row.
Quantized quantize(const DeviceBuffer& x, int64_t rows, int64_t cols, bool per_tensor = false) {
  Quantized q;
  q.data.allocate(rows * cols);
  q.scales.allocate(rows * sizeof(float));
  if (per_tensor) {
    DeviceBuffer sync(kFp8QuantizeSyncWords * sizeof(uint32_t));
    LOOM_CUDA_CHECK(cudaMemset(sync.data(), 0, sync.size()));
    launch_fp8_quantize_tensor(x.as<bf16>(), rows, cols, cols, q.data.as<uint8_t>(), q.scales.as<float>(), rows,
                               sync.as<uint32_t>(), nullptr);
  } else {
    launch_fp8_quantize_rows(x.as<bf16>(), rows, cols, cols, q.data.as<uint8_t>(), q.scales.as<float>(), nullptr);
  }
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> bytes(rows * cols);
  LOOM_CUDA_CHECK(cudaMemcpy(bytes.data(), q.data.data(), bytes.size(), cudaMemcpyDeviceToHost));
  q.host_scales = test::download_f32(q.scales.data(), rows);
  for (int64_t i = 0; i < rows * cols; ++i) q.values.push_back(e4m3_to_float(bytes[i]) * q.host_scales[i / cols]);
  return q;
}

// sum (got - expected)^2 / sum expected^2.
double nmse(const std::vector<float>& got, const std::vector<float>& expected) {
  EXPECT_EQ(got.size(), expected.size());
  double error = 0, norm = 0;
  for (size_t i = 0; i < std::min(got.size(), expected.size()); ++i) {
    error += (got[i] - static_cast<double>(expected[i])) * (got[i] - static_cast<double>(expected[i]));
    norm += static_cast<double>(expected[i]) * expected[i];
  }
  return error / norm;
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
    for (int r = 0; r < shape.n; ++r) {
      float amax = 0.0f;
      for (int c = 0; c < shape.k; ++c) amax = std::max(amax, std::fabs(test::round_to_bf16(w[r * shape.k + c])));
      ASSERT_FLOAT_EQ(q.host_scales[r], amax / kFp8E4m3Max) << "row " << r;
    }
    for (size_t i = 0; i < w.size(); ++i) {  // round to nearest: half of e4m3's 2^-3 step, or of its subnormal step
      const float original = test::round_to_bf16(w[i]);
      ASSERT_LE(std::fabs(q.values[i] - original),
                std::fabs(original) / 16 + q.host_scales[i / shape.k] * std::ldexp(1.0f, -10)) << i;
    }
    for (int m = 1; m <= kSkinnyGemmMaxRows; ++m) {
      const std::vector<float> x = random_values(prng, m * shape.k, 1.0f);
      std::vector<double> expected, magnitude;
      reference(x, q.values, m, shape.n, shape.k, expected, magnitude);
      const DeviceBuffer x_d = upload_bf16(x);
      DeviceBuffer y_d(m * shape.n * sizeof(float));
      launch_skinny_gemm_fp8(x_d.as<bf16>(), m, shape.k, q.data.as<uint8_t>(), q.scales.as<float>(), shape.n, shape.k,
                             y_d.data(), false, shape.n, nullptr);
      const std::vector<float> y = test::download_f32(y_d.data(), m * shape.n);
      for (int i = 0; i < m * shape.n; ++i)
        ASSERT_NEAR(y[i], expected[i], 1e-5 * magnitude[i] + 1e-6) << "m " << m << " at " << i;
    }
  }
}

// The fused gate/up + SwiGLU over FP8 weights gives the unfused path's bits: the FP8
// skinny GEMM to bf16 over [gate; up], then the SwiGLU kernel.
TEST(CudaFp8, FusedGateUpSwigluEqualsTheUnfusedPath) {
  LOOM_REQUIRE_GPU();
  struct Shape { int intermediate, k; };
  for (Shape shape : {Shape{304, 576}, Shape{96, 4112}, Shape{64, 16}}) {  // SwiGLU's kernel: multiples of 8
    SCOPED_TRACE("intermediate " + std::to_string(shape.intermediate) + " k " + std::to_string(shape.k));
    Prng prng(shape.k + 5);
    const int n = 2 * shape.intermediate;
    const DeviceBuffer w_d = upload_bf16(random_values(prng, n * shape.k, 0.05f));
    const Quantized q = quantize(w_d, n, shape.k);
    for (int m = 1; m <= kSkinnyGemmMaxRows; ++m) {
      const DeviceBuffer x_d = upload_bf16(random_values(prng, m * shape.k, 1.0f));
      DeviceBuffer gate_up(m * n * sizeof(bf16)), unfused(m * shape.intermediate * sizeof(bf16)),
          fused(m * shape.intermediate * sizeof(bf16));
      launch_skinny_gemm_fp8(x_d.as<bf16>(), m, shape.k, q.data.as<uint8_t>(), q.scales.as<float>(), n, shape.k,
                             gate_up.data(), true, n, nullptr);
      launch_swiglu(gate_up.as<bf16>(), m, shape.intermediate, unfused.as<bf16>(), nullptr);
      launch_skinny_gate_up_swiglu_fp8(x_d.as<bf16>(), m, shape.k, q.data.as<uint8_t>(), q.scales.as<float>(),
                                       shape.intermediate, shape.k, fused.as<bf16>(), nullptr);
      const std::vector<float> want = test::download_bf16(unfused.data(), m * shape.intermediate);
      const std::vector<float> got = test::download_bf16(fused.data(), m * shape.intermediate);
      EXPECT_EQ(got, want) << "m " << m;
    }
  }
}

// The one-launch per-tensor quantizer: one scale (max |x| / 448) for all, written
// `copies` times, and its sync words left zero so the next launch starts clean.
TEST(CudaFp8, TensorQuantizerGivesOneScaleAndResetsItsSync) {
  LOOM_REQUIRE_GPU();
  DeviceBuffer sync(kFp8QuantizeSyncWords * sizeof(uint32_t));
  LOOM_CUDA_CHECK(cudaMemset(sync.data(), 0, sync.size()));
  struct Shape { int rows, cols; float range; };
  for (Shape shape : {Shape{1, 4096, 3.0f}, Shape{64, 14336, 0.2f}, Shape{7, 336, 50.0f}, Shape{3000, 4096, 1.0f}}) {
    SCOPED_TRACE("rows " + std::to_string(shape.rows) + " cols " + std::to_string(shape.cols));
    Prng prng(shape.rows + shape.cols);
    const std::vector<float> x = test::round_to_bf16(random_values(prng, shape.rows * shape.cols, shape.range));
    const DeviceBuffer x_d = upload_bf16(x);
    DeviceBuffer out(x.size()), scales(shape.rows * sizeof(float));
    launch_fp8_quantize_tensor(x_d.as<bf16>(), shape.rows, shape.cols, shape.cols, out.as<uint8_t>(),
                               scales.as<float>(), shape.rows, sync.as<uint32_t>(), nullptr);
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
    float amax = 0.0f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const std::vector<float> got_scales = test::download_f32(scales.data(), shape.rows);
    for (float s : got_scales) ASSERT_FLOAT_EQ(s, amax / kFp8E4m3Max);
    std::vector<uint8_t> bytes(x.size());
    LOOM_CUDA_CHECK(cudaMemcpy(bytes.data(), out.data(), bytes.size(), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_LE(std::fabs(e4m3_to_float(bytes[i]) * got_scales[0] - x[i]),
                std::fabs(x[i]) / 16 + got_scales[0] * std::ldexp(1.0f, -10)) << i;
    uint32_t words[kFp8QuantizeSyncWords];
    LOOM_CUDA_CHECK(cudaMemcpy(words, sync.data(), sizeof(words), cudaMemcpyDeviceToHost));
    for (uint32_t word : words) ASSERT_EQ(word, 0u);
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
  launch_fp8_dequantize(q.data.as<uint8_t>(), q.scales.as<float>(), rows, cols, out.as<bf16>(), nullptr);
  const std::vector<float> got = test::download_bf16(out.data(), rows * cols);
  for (int i = 0; i < rows * cols; ++i) ASSERT_EQ(got[i], test::round_to_bf16(q.values[i])) << i;
}

// cuBLASLt's FP8 GEMM (steps above the skinny rows): activations quantized
// with one scale, weights with one scale (kTensor) or one per output channel
// (kChannel: an alpha vector, where this cuBLASLt has it). Against a double
// product of the dequantized operands: only fp32 accumulation (and the bf16
// output's rounding) may differ.
TEST(CudaFp8, CublasFp8GemmEqualsTheDequantizedProduct) {
  LOOM_REQUIRE_GPU();
  Gemm gemm(nullptr);
  struct Shape { int m, n, k; };
  for (Gemm::Fp8Scaling scaling : {Gemm::Fp8Scaling::kTensor, Gemm::Fp8Scaling::kChannel}) {
    const bool per_channel = scaling == Gemm::Fp8Scaling::kChannel;
    const bool supported = gemm.supports_fp8(64, 1024, 384, Gemm::Output::kBF16, 384, scaling);
    std::printf("[ fp8 ] cuBLASLt FP8 GEMM with %s weight scales: %s\n", per_channel ? "per-channel" : "per-tensor",
                supported ? "supported" : "not supported");
    if (per_channel && !supported) continue;
    ASSERT_TRUE(supported);
    for (Shape shape : {Shape{5, 256, 512}, Shape{64, 384, 1024}, Shape{300, 128, 4096}, Shape{17, 1000, 336}}) {
      SCOPED_TRACE("m " + std::to_string(shape.m) + " n " + std::to_string(shape.n) + " k " + std::to_string(shape.k));
      ASSERT_TRUE(gemm.supports_fp8(shape.m, shape.k, shape.n, Gemm::Output::kF32, shape.n, scaling));
      Prng prng(shape.m * 7 + shape.k);
      std::vector<float> w = random_values(prng, shape.n * shape.k, 0.05f);
      for (int c = 0; c < shape.k; ++c) w[c] *= 8;  // a row far from the others: per-channel scales differ
      std::vector<float> x = random_values(prng, shape.m * shape.k, 1.0f);
      for (int c = 0; c < shape.k; ++c) x[c] = 0.0f;
      const Quantized wq = quantize(upload_bf16(w), shape.n, shape.k, !per_channel);
      const Quantized xq = quantize(upload_bf16(x), shape.m, shape.k, true);
      std::vector<double> expected, magnitude;
      reference(xq.values, wq.values, shape.m, shape.n, shape.k, expected, magnitude);
      for (Gemm::Output output : {Gemm::Output::kF32, Gemm::Output::kBF16}) {
        const bool is_bf16 = output == Gemm::Output::kBF16;
        DeviceBuffer y_d(shape.m * shape.n * sizeof(float));
        gemm.linear_fp8(xq.data.as<uint8_t>(), xq.scales.as<float>(), shape.m, shape.k, wq.data.as<uint8_t>(),
                        wq.scales.as<float>(), scaling, shape.n, y_d.data(), output, shape.n);
        LOOM_CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> y = is_bf16 ? test::download_bf16(y_d.data(), shape.m * shape.n)
                                             : test::download_f32(y_d.data(), shape.m * shape.n);
        for (int i = 0; i < shape.m * shape.n; ++i) {
          // Hopper's FP8 MMA accumulates with fewer mantissa bits than fp32 between cuBLASLt's promotions.
          const double bound = 1e-4 * magnitude[i] + 1e-6 + (is_bf16 ? std::fabs(expected[i]) / 256 : 0.0);
          ASSERT_NEAR(y[i], expected[i], bound) << (is_bf16 ? "bf16" : "fp32") << " output at " << i;
        }
      }
    }
    // Shapes cuBLASLt's FP8 kernels cannot take (the caller dequantizes instead).
    EXPECT_FALSE(gemm.supports_fp8(8, 24, 64, Gemm::Output::kF32, 64, scaling));
    EXPECT_FALSE(gemm.supports_fp8(8, 64, 60, Gemm::Output::kBF16, 60, scaling));
  }
}

// The tiny model with FP8 weights against the same synthetic weights in bf16:
// a prefill (cuBLASLt's FP8 GEMM) and decode steps (the FP8 skinny GEMM) stay
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
    worst = std::max(worst, nmse(fp8.logits, reference.logits));
    if (s > 0) {
      EXPECT_EQ(fp8.logits, eager.logits) << "decode step " << s << ": graph replay against eager";
    }
  }
  std::printf("[ fp8 ] tiny llama, FP8 weights against bf16: worst logits NMSE %.3g over %zu steps\n", worst,
              steps.size());
  EXPECT_LT(worst, 0.1);  // per-tensor activation and weight scales on a tiny random model
  EXPECT_GT(fp8_backend->graph_stats().replays, 0);
}

// An FP8 checkpoint as llm-compressor writes one, in memory: every linear
// weight e4m3 with one scale per module (kTensor) or per output row (kChannel),
// built by build_model_weights as a loaded checkpoint is.
std::shared_ptr<const ModelWeights> fp8_checkpoint(const ModelConfig& config, const ModelWeights& source) {
  TensorMap tensors = model_weights_to_tensor_map(config, source);
  const bool per_channel = config.quantization.weight_strategy == Fp8WeightStrategy::kChannel;
  for (int layer = 0; layer < config.num_layers; ++layer)
    for (const char* linear : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
      const std::string module = "model.layers." + std::to_string(layer) + "." + linear;
      const Tensor weight = tensors.at(module + ".weight");
      const loom::test::Fp8Linear fp8 = loom::test::quantize_fp8_linear(weight, per_channel);
      tensors[module + ".weight"] = fp8.rows;
      tensors[module + ".weight_scale"] =
          per_channel ? Tensor::from_vector({weight.shape[0], 1}, fp8.scales) : Tensor::scalar(fp8.scales[0]);
    }
  return std::make_shared<const ModelWeights>(build_model_weights(config, tensors, "fp8 twin"));
}

// An FP8 checkpoint on the GPU keeps its e4m3 weights and scales, and runs as the
// bf16 model of its dequantized weights: decode steps (the FP8 skinny GEMM,
// exact weights) within bf16's rounding of them; prefills also within what
// per-tensor activation quantization costs (kTensor: cuBLASLt FP8, after q/k/v
// and gate/up are brought to one scale each) or as W8A16 (kChannel).
TEST(CudaFp8, CheckpointsRunAsTheirDequantizedWeights) {
  LOOM_REQUIRE_GPU();
  const ModelConfig plain = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  const auto source = test::tiny_weights(plain, 43, false);
  for (const Fp8WeightStrategy strategy : {Fp8WeightStrategy::kTensor, Fp8WeightStrategy::kChannel}) {
    const bool per_channel = strategy == Fp8WeightStrategy::kChannel;
    SCOPED_TRACE(per_channel ? "per-channel scales" : "per-tensor scales");
    ModelConfig config = plain;
    config.quantization.method = QuantizationMethod::kCompressedTensors;
    config.quantization.weight_strategy = strategy;
    config.quantization.activations = Fp8Activations::kDynamicPerToken;
    config.quantization.ignore = {"lm_head"};
    const auto checkpoint = fp8_checkpoint(config, *source);
    ASSERT_TRUE(has_fp8_weights(*checkpoint));
    const auto dequantized = std::make_shared<const ModelWeights>(dequantize_fp8_weights(*checkpoint));
    auto fp8_backend = make_cuda_backend(config, *checkpoint, {});
    auto reference = make_cuda_backend(plain, *dequantized, {});
    auto* fp8_impl = dynamic_cast<CudaBackend*>(fp8_backend.get());
    ASSERT_NE(fp8_impl, nullptr);
    EXPECT_TRUE(fp8_impl->model().fp8());
    EXPECT_EQ(fp8_impl->model().layers()[0].qkv_fp8.per_channel, per_channel);
    EXPECT_EQ(fp8_impl->model().layers()[0].down_fp8.per_channel, per_channel);
    constexpr int kBlocks = 64, kBlockSize = 16;
    fp8_backend->allocate_kv_cache({kBlocks, kBlockSize});
    reference->allocate_kv_cache({kBlocks, kBlockSize});
    test::Driver driver(kBlocks, kBlockSize, 5);
    const int a = driver.add_sequence(), b = driver.add_sequence();
    std::vector<Batch> steps = {driver.make_batch({{a, driver.random_tokens(33, plain.vocab_size), std::vector<int32_t>(33, -1), true},
                                                   {b, driver.random_tokens(20, plain.vocab_size), std::vector<int32_t>(20, -1), false}})};
    for (int step = 0; step < 3; ++step)
      steps.push_back(driver.make_batch({{a, driver.random_tokens(1, plain.vocab_size), {-1}, false},
                                         {b, driver.random_tokens(1, plain.vocab_size), {-1}, false}}));
    for (size_t s = 0; s < steps.size(); ++s) {
      const ForwardResult expected = reference->forward(steps[s]);
      const ForwardResult got = fp8_backend->forward(steps[s]);
      const double error = nmse(got.logits, expected.logits);
      std::printf("[ fp8 ] %s checkpoint, step %zu: logits NMSE %.3g against its dequantized weights in bf16\n",
                  per_channel ? "per-channel" : "per-tensor", s, error);
      // The prefill's K/V feed every later step, so a per-tensor prefill's W8A8 error stays in them.
      EXPECT_LT(error, per_channel ? 1e-3 : 0.1) << "step " << s;
    }
  }
}

}  // namespace
}  // namespace loom::cuda
