// Batched multi-LoRA kernels against the CPU backend's LoraApplier: adapters of
// different ranks, modules some adapters do not target, tokens of one adapter
// scattered through the batch, and rows without adapter (which must not move).
#include <algorithm>
#include <initializer_list>
#include <memory>

#include <gtest/gtest.h>

#include "backend/cpu/lora_apply.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_lora.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/step_plan.h"
#include "cuda_test_util.h"

namespace loom::cuda {
namespace {

using test::random_values;

ModelConfig small_config() {
  ModelConfig config;
  config.vocab_size = 64;
  config.hidden_size = 1000;       // two shrink chunks, the second partial
  config.intermediate_size = 1544; // four, the last of 8 features
  config.num_layers = 2;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = 64;
  return config;
}

std::shared_ptr<const LoraAdapter> random_adapter(const ModelConfig& config, const std::vector<int>& ranks_by_target,
                                                  uint64_t seed) {
  Prng prng(seed);
  auto adapter = std::make_shared<LoraAdapter>();
  adapter->name = "adapter" + std::to_string(seed);
  adapter->layers.resize(config.num_layers);
  const int64_t hidden = config.hidden_size;
  const int64_t dims[kNumLoraTargets][2] = {{hidden, config.q_size()},  {hidden, config.kv_size()},
                                            {hidden, config.kv_size()}, {config.q_size(), hidden},
                                            {hidden, config.intermediate_size}, {hidden, config.intermediate_size},
                                            {config.intermediate_size, hidden}};
  for (int layer = 0; layer < config.num_layers; ++layer) {
    for (int target = 0; target < kNumLoraTargets; ++target) {
      const int rank = ranks_by_target[target];
      if (rank == 0) continue;
      LoraModuleWeights module;
      module.rank = rank;
      module.scale = 0.5f + 0.25f * target;
      module.a = Tensor::from_vector({rank, dims[target][0]}, random_values(prng, rank * dims[target][0], 0.1f));
      module.b = Tensor::from_vector({dims[target][1], rank}, random_values(prng, dims[target][1] * rank, 0.1f));
      adapter->layers[layer][target] = std::move(module);
    }
  }
  return adapter;
}

// Four adapters of mixed ranks over six slots and a 41-token batch: slots
// scattered, base rows in between, 20 rows for slot 0 (two tiles).
struct MixedLoraBatch {
  MixedLoraBatch() : config(small_config()), adapters(6), table(6, config), prng(9) {
    adapters[0] = random_adapter(config, {16, 16, 16, 16, 16, 16, 16}, 1);
    adapters[2] = random_adapter(config, {4, 0, 4, 0, 0, 0, 0}, 2);     // q, v only, rank 4
    adapters[3] = random_adapter(config, {3, 32, 0, 5, 0, 1, 64}, 3);   // odd ranks, gaps
    adapters[5] = random_adapter(config, {8, 8, 8, 8, 8, 8, 8}, 4);
    for (int slot = 0; slot < 6; ++slot) table.set(slot, adapters[slot].get(), nullptr);
    const int32_t choices[] = {-1, 0, 0, 2, 3, 5, 0};
    for (int t = 0; t < 41; ++t) {
      batch.token_ids.push_back(0);
      batch.positions.push_back(t);
      batch.adapter_slots.push_back(choices[prng.next_below(7)]);
    }
    BatchSequence sequence;
    sequence.num_new_tokens = 41;
    sequence.num_blocks = 3;
    batch.sequences.push_back(sequence);
    batch.block_tables = {0, 1, 2};
    plan.build(batch, {16, config.num_heads, config.num_kv_heads, 132});
    plan_d = test::upload(plan.words());
  }
  const int32_t* words() const { return plan_d.as<int32_t>(); }
  // The launch of `targets` (their in_features `in`) over x, delta rows by LoRA row into y.
  LoraParams params(int layer, std::initializer_list<LoraTarget> targets, int in, const DeviceBuffer& x, float* v,
                    int max_splits, void* y, bool y_bf16, int y_stride) const {
    LoraParams p;
    p.modules = table.device_table();
    p.num_layers = config.num_layers;
    p.layer = layer;
    p.sorted_tokens = words() + plan.sections().lora_tokens;
    p.tiles = reinterpret_cast<const LoraTile*>(words() + plan.sections().lora_tiles);
    p.num_tiles = plan.num_lora_tiles();
    p.num_rows = plan.num_lora_rows();
    p.max_rank = table.max_rank();
    p.x = x.as<bf16>();
    p.x_stride = in;
    p.v = v;
    p.max_splits = max_splits;
    p.y = y;
    p.y_is_bf16 = y_bf16;
    p.y_stride = y_stride;
    p.write_by_lora_row = true;
    int column = 0;
    for (LoraTarget target : targets) {
      const int out = out_features(target);
      p.targets[p.num_targets++] = {static_cast<int32_t>(target), in, out, column};
      column += out;
    }
    return p;
  }
  int out_features(LoraTarget target) const {
    return target == LoraTarget::kK || target == LoraTarget::kV       ? config.kv_size()
           : target == LoraTarget::kGate || target == LoraTarget::kUp ? config.intermediate_size
           : target == LoraTarget::kQ                                 ? config.q_size()
                                                                      : config.hidden_size;
  }

  ModelConfig config;
  std::vector<std::shared_ptr<const LoraAdapter>> adapters;
  DeviceLoraTable table;
  Prng prng;
  Batch batch;
  StepPlan plan;
  DeviceBuffer plan_d;
};

TEST(CudaLora, MixedAdaptersRanksAndBaseRowsMatchCpu) {
  LOOM_REQUIRE_GPU();
  MixedLoraBatch mixed;
  const ModelConfig& config = mixed.config;
  const auto& adapters = mixed.adapters;
  const DeviceLoraTable& table = mixed.table;
  const Batch& batch = mixed.batch;
  const StepPlan& plan = mixed.plan;
  Prng& prng = mixed.prng;
  const int32_t* words = mixed.words();

  cpu::LoraApplier cpu_lora;
  cpu_lora.group_tokens(batch.adapter_slots, 6);
  const int n = batch.num_tokens();
  const int hidden = config.hidden_size, q_size = config.q_size(), kv_size = config.kv_size();
  const int intermediate = config.intermediate_size;
  const int max_rank = table.max_rank();
  const int max_splits = lora_splits(intermediate);
  DeviceBuffer v_d(3 * max_splits * plan.num_lora_rows() * max_rank * sizeof(float));

  struct Case {
    std::vector<LoraTarget> targets;
    int in_features, out_width;
    bool y_bf16;
  };
  const Case cases[] = {{{LoraTarget::kQ, LoraTarget::kK, LoraTarget::kV}, hidden, q_size + 2 * kv_size, false},
                        {{LoraTarget::kO}, q_size, hidden, false},
                        {{LoraTarget::kGate, LoraTarget::kUp}, hidden, 2 * intermediate, true},
                        {{LoraTarget::kDown}, intermediate, hidden, false}};
  for (int layer = 0; layer < config.num_layers; ++layer) {
    for (const Case& c : cases) {
      SCOPED_TRACE("layer " + std::to_string(layer) + " first target " + std::to_string(static_cast<int>(c.targets[0])));
      const std::vector<float> x = random_values(prng, n * c.in_features, 1.0f);
      const std::vector<float> y = random_values(prng, n * c.out_width, 1.0f);
      // CPU: each target adds into its column block of y.
      std::vector<float> expected = y;
      int column = 0;
      for (LoraTarget target : c.targets) {
        const int out = mixed.out_features(target);
        std::vector<float> block(n * out);
        for (int t = 0; t < n; ++t)
          for (int o = 0; o < out; ++o) block[t * out + o] = y[t * c.out_width + column + o];
        cpu_lora.apply(target, layer, x.data(), c.in_features, block.data(), out, adapters);
        for (int t = 0; t < n; ++t)
          for (int o = 0; o < out; ++o) expected[t * c.out_width + column + o] = block[t * out + o];
        column += out;
      }

#ifdef LOOM_CUDA_MEASURE
      // The benchmark's build (cuda_measure_test): its variants too. -1: fused kernel, else split kernels, expand columns.
      for (const int variant : {-1, 0, 1, 2, 4}) {
#else
      for (const int variant : {1}) {  // serving's split kernels
#endif
      const bool fused = variant < 0;
      SCOPED_TRACE(fused ? "fused kernel" : "split kernels, expand columns " + std::to_string(variant));
#ifdef LOOM_CUDA_MEASURE
      const LoraVariant lora_variant{fused, fused ? 1 : variant};
      auto launch = [&](const LoraParams& p) { launch_lora_variant(p, nullptr, lora_variant); };
#else
      auto launch = [&](const LoraParams& p) { launch_lora(p, nullptr); };
#endif
      DeviceBuffer x_d = test::upload_bf16(x);
      DeviceBuffer y_d = c.y_bf16 ? test::upload_bf16(y) : test::upload_f32(y);
      LoraParams params;
      params.modules = table.device_table();
      params.num_layers = config.num_layers;
      params.layer = layer;
      params.sorted_tokens = words + plan.sections().lora_tokens;
      params.tiles = reinterpret_cast<const LoraTile*>(words + plan.sections().lora_tiles);
      params.num_tiles = plan.num_lora_tiles();
      params.num_rows = plan.num_lora_rows();
      params.max_rank = max_rank;
      params.x = x_d.as<bf16>();
      params.x_stride = c.in_features;
      params.v = v_d.as<float>();
      params.max_splits = max_splits;
      params.y = y_d.data();
      params.y_is_bf16 = c.y_bf16;
      params.y_stride = c.out_width;
      int y_column = 0;
      for (LoraTarget target : c.targets) {
        const int out = mixed.out_features(target);
        params.targets[params.num_targets++] = {static_cast<int32_t>(target), c.in_features, out, y_column};
        y_column += out;
      }
      launch(params);
      const std::vector<float> out = c.y_bf16 ? test::download_bf16(y_d.data(), n * c.out_width)
                                              : test::download_f32(y_d.data(), n * c.out_width);
      const std::vector<float> reference = c.y_bf16 ? test::round_to_bf16(expected) : expected;
      EXPECT_TRUE(test::close_bf16(out, reference));
      for (int t = 0; t < n; ++t) {
        if (batch.adapter_slots[t] >= 0) continue;
        for (int o = 0; o < c.out_width; ++o)
          ASSERT_EQ(out[t * c.out_width + o], y[t * c.out_width + o]) << "base row " << t << " moved";
      }

      // The backend's mode: the delta alone, written per LoRA row (NaN-poisoned first: every entry is written).
      const int num_lora_rows = plan.num_lora_rows();
      DeviceBuffer delta_d(static_cast<size_t>(num_lora_rows) * c.out_width * sizeof(float));
      LOOM_CUDA_CHECK(cudaMemset(delta_d.data(), 0xff, delta_d.size()));
      params.y = delta_d.data();
      params.y_is_bf16 = c.y_bf16;  // the backend's gate/up delta is bf16
      params.write_by_lora_row = true;
      launch(params);
      const size_t delta_count = static_cast<size_t>(num_lora_rows) * c.out_width;
      const std::vector<float> delta = c.y_bf16 ? test::download_bf16(delta_d.data(), delta_count)
                                                : test::download_f32(delta_d.data(), delta_count);
      std::vector<float> expected_delta(delta.size());
      for (int row = 0; row < num_lora_rows; ++row) {
        const int t = plan.words()[plan.sections().lora_tokens + row];
        ASSERT_EQ(plan.words()[plan.sections().lora_row_of_token + t], row);
        for (int o = 0; o < c.out_width; ++o)
          expected_delta[row * c.out_width + o] = expected[t * c.out_width + o] - y[t * c.out_width + o];
      }
      EXPECT_TRUE(test::close_bf16(delta, expected_delta)) << "write_by_lora_row";
      }
    }
  }
}

// A folded step's consumers (CudaTuning::lora_fold_max_rows: the shrink alone,
// each consumer expanding for its own columns) against the delta rows of the
// shrink + expand pair, which the test above holds to the CPU.
TEST(CudaLora, FoldedConsumersMatchTheExpandedDeltaRows) {
  LOOM_REQUIRE_GPU();
  MixedLoraBatch mixed;
  const ModelConfig& config = mixed.config;
  Prng& prng = mixed.prng;
  const int n = mixed.batch.num_tokens();
  const int hidden = config.hidden_size, intermediate = config.intermediate_size;
  const int rows = mixed.plan.num_lora_rows();
  const int max_splits = lora_splits(intermediate);
  DeviceBuffer v_d(3 * static_cast<size_t>(max_splits) * rows * mixed.table.max_rank() * sizeof(float));
  DeviceBuffer delta_rows_d(static_cast<size_t>(rows) * 2 * intermediate * sizeof(float));
  const int32_t* lora_rows = mixed.words() + mixed.plan.sections().lora_row_of_token;
  auto fold_of = [&](const LoraParams& p) {
    LoraFold fold;
    fold.v = p.v;
    fold.num_rows = p.num_rows;
    fold.max_rank = p.max_rank;
    fold.max_splits = p.max_splits;
    fold.splits = lora_splits(p.targets[0].in_features);
    fold.modules = p.modules;
    fold.num_layers = p.num_layers;
    fold.layer = p.layer;
    fold.first_target = p.targets[0].target;
    fold.lora_rows = lora_rows;
    fold.adapter_slots = mixed.words() + mixed.plan.sections().row_adapter_slots;
    fold.tiles = p.tiles;
    fold.num_tiles = p.num_tiles;
    fold.sorted_tokens = p.sorted_tokens;
    return fold;
  };
  // v of one target summed over its chunks: [LoRA rows][max_rank].
  auto summed_v = [&](const float* v, int splits) {
    const size_t stride = static_cast<size_t>(rows) * mixed.table.max_rank();
    const std::vector<float> partials = test::download_f32(v, splits * stride);
    std::vector<float> sums(stride, 0.0f);
    for (int split = 0; split < splits; ++split)
      for (size_t e = 0; e < stride; ++e) sums[e] += partials[split * stride + e];
    return sums;
  };

  for (int layer = 0; layer < config.num_layers; ++layer) {
    // o (input q_size) and down (input intermediate: several chunks) into the residual add + norm.
    for (const LoraTarget target : {LoraTarget::kO, LoraTarget::kDown}) {
      SCOPED_TRACE("layer " + std::to_string(layer) + " target " + std::to_string(static_cast<int>(target)));
      const int in = target == LoraTarget::kO ? config.q_size() : intermediate;
      const DeviceBuffer x_d = test::upload_bf16(random_values(prng, static_cast<size_t>(n) * in, 1.0f));
      const std::vector<float> residual = random_values(prng, static_cast<size_t>(n) * hidden, 1.0f, false);
      const DeviceBuffer delta_d = test::upload_f32(random_values(prng, static_cast<size_t>(n) * hidden, 1.0f, false));
      const DeviceBuffer weight_d = test::upload_f32(random_values(prng, hidden, 1.0f, false));
      const LoraParams p = mixed.params(layer, {target}, in, x_d, v_d.as<float>(), max_splits, delta_rows_d.data(),
                                        false, hidden);
      DeviceBuffer expanded_residual = test::upload_f32(residual), folded_residual = test::upload_f32(residual);
      DeviceBuffer expanded_out(static_cast<size_t>(n) * hidden * sizeof(bf16)), folded_out(expanded_out.size());
      launch_lora(p, nullptr);
      launch_add_rms_norm(expanded_residual.as<float>(), delta_d.as<float>(), nullptr, weight_d.as<float>(), 1e-5f,
                          hidden, nullptr, n, expanded_out.as<bf16>(), nullptr, delta_rows_d.as<float>(), lora_rows);
      LOOM_CUDA_CHECK(cudaMemset(v_d.data(), 0xff, v_d.size()));  // the folded launch writes v again
      launch_lora_shrink(p, nullptr);
      launch_add_rms_norm(folded_residual.as<float>(), delta_d.as<float>(), nullptr, weight_d.as<float>(), 1e-5f,
                          hidden, nullptr, n, folded_out.as<bf16>(), nullptr, nullptr, nullptr, fold_of(p));
      const std::vector<float> expanded = test::download_f32(expanded_residual.data(), residual.size());
      const std::vector<float> folded = test::download_f32(folded_residual.data(), residual.size());
      const test::Closeness c = test::compare(folded, expanded, 1e-5, 1e-5);
      EXPECT_EQ(c.num_outside, 0u) << "residual: " << c.describe();
      EXPECT_TRUE(test::close_bf16(test::download_bf16(folded_out.data(), residual.size()),
                                   test::download_bf16(expanded_out.data(), residual.size())));
      size_t moved = 0;  // the LoRA rows did get a delta beyond the base add
      for (int t = 0; t < n; ++t)
        for (int i = 0; i < hidden && mixed.batch.adapter_slots[t] >= 0; ++i)
          moved += folded[t * hidden + i] != residual[t * hidden + i];
      EXPECT_GT(moved, 0u);
    }

    // gate/up into SwiGLU.
    SCOPED_TRACE("layer " + std::to_string(layer) + " gate/up");
    const DeviceBuffer x_d = test::upload_bf16(random_values(prng, static_cast<size_t>(n) * hidden, 1.0f));
    const DeviceBuffer gate_up_d = test::upload_bf16(random_values(prng, static_cast<size_t>(n) * 2 * intermediate, 2.0f));
    // Serving's unfolded gate/up delta rows are bf16 (the fold rounds its deltas to match).
    const LoraParams p = mixed.params(layer, {LoraTarget::kGate, LoraTarget::kUp}, hidden, x_d, v_d.as<float>(),
                                      max_splits, delta_rows_d.data(), true, 2 * intermediate);
    DeviceBuffer expanded_out(static_cast<size_t>(n) * intermediate * sizeof(bf16)), folded_out(expanded_out.size()),
        base_out(expanded_out.size());
    launch_lora(p, nullptr);
    launch_swiglu(gate_up_d.as<bf16>(), n, intermediate, expanded_out.as<bf16>(), nullptr, delta_rows_d.as<float>(),
                  lora_rows, true);
    LOOM_CUDA_CHECK(cudaMemset(v_d.data(), 0xff, v_d.size()));
    launch_lora_shrink(p, nullptr);
    // With down's shrink over SwiGLU's output (into v's third target, which gate/up leave alone).
    LoraFold fold = fold_of(p);
    float* down_v = v_d.as<float>() + 2 * static_cast<size_t>(max_splits) * rows * mixed.table.max_rank();
    LOOM_CUDA_CHECK(cudaMemset(down_v, 0, static_cast<size_t>(max_splits) * rows * mixed.table.max_rank() * sizeof(float)));
    fold.down_v = down_v;
    launch_swiglu(gate_up_d.as<bf16>(), n, intermediate, folded_out.as<bf16>(), nullptr, nullptr, nullptr, false, fold);
    launch_swiglu(gate_up_d.as<bf16>(), n, intermediate, base_out.as<bf16>(), nullptr);
    const size_t count = static_cast<size_t>(n) * intermediate;
    const std::vector<float> folded = test::download_bf16(folded_out.data(), count);
    const std::vector<float> base = test::download_bf16(base_out.data(), count);
    EXPECT_TRUE(test::close_bf16(folded, test::download_bf16(expanded_out.data(), count)));
    for (int t = 0; t < n; ++t) {
      bool moved = false;
      for (int i = 0; i < intermediate; ++i) {
        if (mixed.batch.adapter_slots[t] < 0) {
          ASSERT_EQ(folded[t * intermediate + i], base[t * intermediate + i]) << "base row " << t << " moved";
        }
        moved = moved || folded[t * intermediate + i] != base[t * intermediate + i];
      }
      // Slot 2's adapter has no gate/up modules; every other adapter row moves.
      if (mixed.batch.adapter_slots[t] >= 0 && mixed.batch.adapter_slots[t] != 2) {
        EXPECT_TRUE(moved) << "row " << t;
      }
    }
    // Down's shrink from SwiGLU against the shrink kernel over the same (folded) output.
    const std::vector<float> fused_down = summed_v(down_v, lora_splits(intermediate));
    DeviceBuffer down_check_d(static_cast<size_t>(max_splits) * rows * mixed.table.max_rank() * sizeof(float));
    LOOM_CUDA_CHECK(cudaMemset(down_check_d.data(), 0, down_check_d.size()));
    const LoraParams down = mixed.params(layer, {LoraTarget::kDown}, intermediate, folded_out, down_check_d.as<float>(),
                                         max_splits, nullptr, false, hidden);
    launch_lora_shrink(down, nullptr);
    const std::vector<float> shrunk_down = summed_v(down_check_d.as<float>(), lora_splits(intermediate));
    EXPECT_TRUE(test::close_bf16(fused_down, shrunk_down, true)) << "down shrink inside SwiGLU";
    EXPECT_GT(std::count_if(fused_down.begin(), fused_down.end(), [](float value) { return value != 0.0f; }), 0);
  }
}

}  // namespace
}  // namespace loom::cuda
