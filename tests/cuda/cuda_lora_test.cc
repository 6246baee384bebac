// Batched multi-LoRA kernels against the CPU backend's LoraApplier: adapters of
// different ranks, modules some adapters do not target, tokens of one adapter
// scattered through the batch, and rows without adapter (which must not move).
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

TEST(CudaLora, MixedAdaptersRanksAndBaseRowsMatchCpu) {
  LOOM_REQUIRE_GPU();
  const ModelConfig config = small_config();
  std::vector<std::shared_ptr<const LoraAdapter>> adapters(6);
  adapters[0] = random_adapter(config, {16, 16, 16, 16, 16, 16, 16}, 1);
  adapters[2] = random_adapter(config, {4, 0, 4, 0, 0, 0, 0}, 2);     // q, v only, rank 4
  adapters[3] = random_adapter(config, {3, 32, 0, 5, 0, 1, 64}, 3);   // odd ranks, gaps
  adapters[5] = random_adapter(config, {8, 8, 8, 8, 8, 8, 8}, 4);

  DeviceLoraTable table(6, config);
  for (int slot = 0; slot < 6; ++slot) table.set(slot, adapters[slot].get(), nullptr);

  // 41 tokens: slots scattered, base rows in between, 20 rows for slot 0 (two tiles).
  Batch batch;
  Prng prng(9);
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
  StepPlan plan;
  plan.build(batch, {16, config.num_heads, config.num_kv_heads, 132});
  DeviceBuffer plan_d = test::upload(plan.words());
  const int32_t* words = plan_d.as<int32_t>();

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
        const int out = target == LoraTarget::kK || target == LoraTarget::kV ? kv_size
                        : target == LoraTarget::kGate || target == LoraTarget::kUp ? intermediate
                        : target == LoraTarget::kQ ? q_size : hidden;
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
        const int out = target == LoraTarget::kK || target == LoraTarget::kV ? kv_size
                        : target == LoraTarget::kGate || target == LoraTarget::kUp ? intermediate
                        : target == LoraTarget::kQ ? q_size : hidden;
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

}  // namespace
}  // namespace loom::cuda
