// Element-wise / row-wise kernels of the CUDA backend against the CPU backend's
// functions on the same (bf16-rounded) inputs.
#include <cmath>

#include <gtest/gtest.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/rope.h"
#include "cuda_test_util.h"
#include "synthetic/synthetic_model.h"
#include "synthetic/synthetic_weights.h"
#include "util/half.h"

namespace loom::cuda {
namespace {

using test::close_bf16;
using test::download_bf16;
using test::download_f32;
using test::random_values;
using test::upload;
using test::upload_bf16;
using test::upload_f32;

TEST(CudaKernels, EmbeddingGathersRowsExactly) {
  LOOM_REQUIRE_GPU();
  Prng prng(1);
  const int vocab = 97, hidden = 576;
  const std::vector<float> table = random_values(prng, vocab * hidden, 0.5f);
  const std::vector<int32_t> tokens = {5, 0, 96, 5, 42};
  DeviceBuffer table_d = upload_bf16(table), tokens_d = upload(tokens), out_d(tokens.size() * hidden * 4);
  launch_embedding(tokens_d.as<int32_t>(), tokens.size(), table_d.as<bf16>(), hidden, out_d.as<float>(), nullptr);
  const std::vector<float> out = download_f32(out_d.data(), tokens.size() * hidden);
  for (size_t t = 0; t < tokens.size(); ++t)
    for (int i = 0; i < hidden; ++i) ASSERT_EQ(out[t * hidden + i], table[tokens[t] * hidden + i]) << t << "," << i;
}

TEST(CudaKernels, AddRmsNormMatchesCpuAndUpdatesResidual) {
  LOOM_REQUIRE_GPU();
  for (int hidden : {64, 96, 576, 4096}) {
    Prng prng(hidden);
    const int rows = 7;
    const std::vector<float> residual = random_values(prng, rows * hidden, 2.0f, false);
    const std::vector<float> delta = random_values(prng, rows * hidden, 1.0f, false);
    const std::vector<float> bias = random_values(prng, hidden, 0.1f, false);
    const std::vector<float> weight = random_values(prng, hidden, 1.5f, false);
    std::vector<float> expected_residual(rows * hidden);
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < hidden; ++i)
        expected_residual[r * hidden + i] = residual[r * hidden + i] + delta[r * hidden + i] + bias[i];
    std::vector<float> expected(rows * hidden);
    cpu::rms_norm_rows(expected_residual.data(), rows, hidden, weight.data(), 1e-5f, expected.data());

    DeviceBuffer residual_d = upload_f32(residual), delta_d = upload_f32(delta), bias_d = upload_f32(bias),
                 weight_d = upload_f32(weight), out_d(rows * hidden * 2);
    cudaMemset(out_d.data(), 0xff, out_d.size());  // poison: NaN in bf16
    launch_add_rms_norm(residual_d.as<float>(), delta_d.as<float>(), bias_d.as<float>(), weight_d.as<float>(), 1e-5f,
                        hidden, nullptr, rows, out_d.as<bf16>(), nullptr);
    EXPECT_TRUE(close_bf16(download_bf16(out_d.data(), rows * hidden), expected)) << "hidden " << hidden;
    const std::vector<float> updated = download_f32(residual_d.data(), rows * hidden);
    for (int i = 0; i < rows * hidden; ++i)
      ASSERT_FLOAT_EQ(updated[i], expected_residual[i]) << "hidden " << hidden << " element " << i;

    // Gathered rows (the logits path), no delta: rows 6 and 2 only, residual untouched.
    const std::vector<int32_t> row_index = {6, 2};
    DeviceBuffer index_d = upload(row_index);
    launch_add_rms_norm(residual_d.as<float>(), nullptr, nullptr, weight_d.as<float>(), 1e-5f, hidden,
                        index_d.as<int32_t>(), 2, out_d.as<bf16>(), nullptr);
    const std::vector<float> gathered = download_bf16(out_d.data(), 2 * hidden);
    const std::vector<float> expected_6(expected.begin() + 6 * hidden, expected.begin() + 7 * hidden);
    const std::vector<float> expected_2(expected.begin() + 2 * hidden, expected.begin() + 3 * hidden);
    EXPECT_TRUE(close_bf16({gathered.begin(), gathered.begin() + hidden}, expected_6));
    EXPECT_TRUE(close_bf16({gathered.begin() + hidden, gathered.end()}, expected_2));
  }
}

// Bias, q/k norm and RoPE against the CPU backend's Rope, for each arch's
// features and the 8b preset's llama3-scaled head_dim 128 at long positions.
void check_qkv_postprocess(const ModelConfig& config, const std::vector<int32_t>& positions) {
  constexpr int kBlockSize = 4;
  const int n = static_cast<int>(positions.size());
  const int q_size = config.q_size(), kv_size = config.kv_size(), width = q_size + 2 * kv_size;
  const int head_dim = config.head_dim;
  Prng prng(static_cast<uint64_t>(config.hidden_size) * 31 + head_dim);
  const std::vector<float> qkv = random_values(prng, n * width, 1.0f, false);
  const std::vector<float> bias = random_values(prng, width, 0.2f, false);
  const std::vector<float> q_norm = random_values(prng, head_dim, 2.0f, false);
  const std::vector<float> k_norm = random_values(prng, head_dim, 2.0f, false);
  const int num_slots = 4 * n;
  std::vector<int32_t> slots(n);
  for (int t = 0; t < n; ++t) slots[t] = t % 3 == 2 ? -1 : (3 * t + 1) % num_slots;  // every third token not written

  // CPU reference.
  const Rope rope(config);
  std::vector<float> q_ref(n * q_size), k_ref(n * kv_size), v_ref(n * kv_size);
  for (int t = 0; t < n; ++t) {
    std::vector<float> row(qkv.begin() + t * width, qkv.begin() + (t + 1) * width);
    if (config.qkv_bias)
      for (int i = 0; i < width; ++i) row[i] += bias[i];
    if (config.qk_norm) {
      cpu::rms_norm_rows(row.data(), config.num_heads, head_dim, q_norm.data(), config.rms_norm_eps, row.data());
      cpu::rms_norm_rows(row.data() + q_size, config.num_kv_heads, head_dim, k_norm.data(), config.rms_norm_eps,
                         row.data() + q_size);
    }
    std::vector<float> cos_table(head_dim / 2), sin_table(head_dim / 2);
    rope.cos_sin(positions[t], cos_table.data(), sin_table.data());
    rope.rotate(row.data(), config.num_heads, cos_table.data(), sin_table.data());
    rope.rotate(row.data() + q_size, config.num_kv_heads, cos_table.data(), sin_table.data());
    std::copy(row.begin(), row.begin() + q_size, q_ref.begin() + t * q_size);
    std::copy(row.begin() + q_size, row.begin() + q_size + kv_size, k_ref.begin() + t * kv_size);
    std::copy(row.begin() + q_size + kv_size, row.end(), v_ref.begin() + t * kv_size);
  }

  DeviceBuffer qkv_d = upload_f32(qkv), bias_d = upload_f32(bias), q_norm_d = upload_f32(q_norm),
               k_norm_d = upload_f32(k_norm), inv_freq_d = upload_f32(rope.inverse_frequencies()),
               positions_d = upload(positions), slots_d = upload(slots), q_d(n * q_size * 2),
               k_cache(num_slots * kv_size * 2), v_cache(num_slots * kv_size * 2);
  cudaMemset(q_d.data(), 0xff, q_d.size());
  cudaMemset(k_cache.data(), 0xff, k_cache.size());
  cudaMemset(v_cache.data(), 0xff, v_cache.size());
  QkvParams params;
  params.qkv = qkv_d.as<float>();
  params.bias = config.qkv_bias ? bias_d.as<float>() : nullptr;
  params.q_norm = config.qk_norm ? q_norm_d.as<float>() : nullptr;
  params.k_norm = config.qk_norm ? k_norm_d.as<float>() : nullptr;
  params.inv_freq = inv_freq_d.as<float>();
  params.positions = positions_d.as<int32_t>();
  params.kv_slots = slots_d.as<int32_t>();
  params.q_out = q_d.as<bf16>();
  params.k_cache = k_cache.as<bf16>();
  params.v_cache = v_cache.as<bf16>();
  params.num_tokens = n;
  params.num_heads = config.num_heads;
  params.num_kv_heads = config.num_kv_heads;
  params.head_dim = head_dim;
  params.block_size = kBlockSize;
  params.eps = config.rms_norm_eps;
  launch_qkv_postprocess(params, nullptr);

  EXPECT_TRUE(close_bf16(download_bf16(q_d.data(), n * q_size), q_ref)) << "q, head_dim " << head_dim;
  const std::vector<float> k_all = download_bf16(k_cache.data(), num_slots * kv_size);
  const std::vector<float> v_all = download_bf16(v_cache.data(), num_slots * kv_size);
  // Gathers slot s's heads out of the pool layout (plan_types.h's kv_element_index).
  auto slot_values = [&](const std::vector<float>& pool, int s) {
    std::vector<float> values;
    for (int h = 0; h < config.num_kv_heads; ++h) {
      const int64_t first = kv_element_index(s, h, kBlockSize, config.num_kv_heads, head_dim);
      values.insert(values.end(), pool.begin() + first, pool.begin() + first + head_dim);
    }
    return values;
  };
  std::vector<bool> written(num_slots, false);
  for (int t = 0; t < n; ++t) {
    if (slots[t] < 0) continue;
    written[slots[t]] = true;
    EXPECT_TRUE(close_bf16(slot_values(k_all, slots[t]), {k_ref.begin() + t * kv_size, k_ref.begin() + (t + 1) * kv_size}))
        << "k token " << t;
    EXPECT_TRUE(close_bf16(slot_values(v_all, slots[t]), {v_ref.begin() + t * kv_size, v_ref.begin() + (t + 1) * kv_size}))
        << "v token " << t;
  }
  for (int s = 0; s < num_slots; ++s) {
    if (written[s]) continue;
    for (float value : slot_values(k_all, s)) ASSERT_TRUE(std::isnan(value)) << "slot " << s << " was written";
    for (float value : slot_values(v_all, s)) ASSERT_TRUE(std::isnan(value)) << "slot " << s << " was written";
  }
}

TEST(CudaKernels, QkvPostprocessMatchesCpuForEveryArch) {
  LOOM_REQUIRE_GPU();
  const std::vector<int32_t> positions = {0, 1, 2, 7, 100, 1023, 1024, 4095, 3, 9};
  for (Architecture arch : {Architecture::kLlama, Architecture::kQwen2, Architecture::kQwen3, Architecture::kMistral}) {
    SCOPED_TRACE(architecture_short_name(arch));
    check_qkv_postprocess(synthetic_model_config(arch, SyntheticPreset::kTiny), positions);
  }
}

TEST(CudaKernels, QkvPostprocessLlama3ScalingAtLongPositions) {
  LOOM_REQUIRE_GPU();
  ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::k8b);
  config.num_heads = 8;  // fewer heads keep the test small; rope is per head
  config.num_kv_heads = 2;
  check_qkv_postprocess(config, {0, 1, 8191, 8192, 16383, 65536, 131071, 500, 12345});
}

TEST(CudaKernels, SwigluMatchesCpu) {
  LOOM_REQUIRE_GPU();
  Prng prng(3);
  const int n = 5, intermediate = 1536;
  const std::vector<float> gate_up = random_values(prng, n * 2 * intermediate, 4.0f);
  std::vector<float> gate(n * intermediate), up(n * intermediate);
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < intermediate; ++i) {
      gate[t * intermediate + i] = gate_up[t * 2 * intermediate + i];
      up[t * intermediate + i] = gate_up[t * 2 * intermediate + intermediate + i];
    }
  cpu::silu_multiply(gate.data(), up.data(), n * intermediate);
  DeviceBuffer in_d = upload_bf16(gate_up), out_d(n * intermediate * 2);
  launch_swiglu(in_d.as<bf16>(), n, intermediate, out_d.as<bf16>(), nullptr);
  EXPECT_TRUE(close_bf16(download_bf16(out_d.data(), n * intermediate), gate));
}

TEST(CudaKernels, SkinnyGemmAndFusedSwigluMatchCpu) {
  LOOM_REQUIRE_GPU();
  struct Shape { int n, k; };
  for (Shape shape : {Shape{300, 576}, Shape{1029, 4104}, Shape{64, 16}}) {
    for (int m = 1; m <= kSkinnyGemmMaxRows; ++m) {
      SCOPED_TRACE("m " + std::to_string(m) + " n " + std::to_string(shape.n) + " k " + std::to_string(shape.k));
      Prng prng(m * 1000 + shape.k);
      const std::vector<float> x = random_values(prng, m * shape.k, 1.0f);
      const std::vector<float> w = random_values(prng, 2 * shape.n * shape.k, 0.05f);
      std::vector<float> expected(m * 2 * shape.n);
      cpu::linear(x.data(), m, shape.k, w.data(), nullptr, 2 * shape.n, expected.data());
      DeviceBuffer x_d = upload_bf16(x), w_d = upload_bf16(w), y_d(m * 2 * shape.n * 4), act_d(m * shape.n * 2);
      launch_skinny_gemm(x_d.as<bf16>(), m, shape.k, w_d.as<bf16>(), 2 * shape.n, shape.k, y_d.data(), false,
                         2 * shape.n, nullptr);
      EXPECT_TRUE(close_bf16(download_f32(y_d.data(), m * 2 * shape.n), expected, true));
      // Fused gate/up + SwiGLU over the same weight seen as [gate; up].
      std::vector<float> gate(m * shape.n), up(m * shape.n);
      for (int r = 0; r < m; ++r)
        for (int i = 0; i < shape.n; ++i) {
          gate[r * shape.n + i] = test::round_to_bf16(expected[r * 2 * shape.n + i]);
          up[r * shape.n + i] = test::round_to_bf16(expected[r * 2 * shape.n + shape.n + i]);
        }
      cpu::silu_multiply(gate.data(), up.data(), m * shape.n);
      launch_skinny_gate_up_swiglu(x_d.as<bf16>(), m, shape.k, w_d.as<bf16>(), shape.n, shape.k, act_d.as<bf16>(),
                                   nullptr);
      EXPECT_TRUE(close_bf16(download_bf16(act_d.data(), m * shape.n), gate, true));
    }
  }
}

TEST(CudaKernels, SyntheticFillEqualsMakeModelValues) {
  LOOM_REQUIRE_GPU();
  const ModelConfig config = synthetic_model_config(Architecture::kQwen3, SyntheticPreset::kTiny);
  const std::vector<SyntheticTensorSpec> specs = synthetic_base_tensor_specs(config);
  int checked = 0;
  for (const SyntheticTensorSpec& spec : specs) {
    if (spec.name.find("layers.1.") == std::string::npos && spec.name.rfind("model.embed", 0) != 0) continue;
    const uint64_t seed = 7;
    const Tensor host = make_synthetic_tensor(spec, seed);
    DeviceBuffer bf16_d(spec.numel() * 2), f32_d(spec.numel() * 4);
    launch_synthetic_fill_bf16(bf16_d.as<bf16>(), spec.numel(), synthetic_tensor_seed(seed, spec.name), spec.is_norm,
                               spec.scale, nullptr);
    launch_synthetic_fill_f32(f32_d.as<float>(), spec.numel(), synthetic_tensor_seed(seed, spec.name), spec.is_norm,
                              spec.scale, false, nullptr);
    const std::vector<float> as_bf16 = download_bf16(bf16_d.data(), spec.numel());
    const std::vector<float> as_f32 = download_f32(f32_d.data(), spec.numel());
    for (int64_t i = 0; i < spec.numel(); ++i) {
      ASSERT_EQ(as_f32[i], host.data[i]) << spec.name << " element " << i;
      ASSERT_EQ(as_bf16[i], test::round_to_bf16(host.data[i])) << spec.name << " element " << i;
    }
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

}  // namespace
}  // namespace loom::cuda
