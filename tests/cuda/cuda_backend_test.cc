// End to end: the CUDA backend against the CPU backend on the tiny synthetic
// models of every arch (with adapters, mixed batches, prefill, decode and
// chunked steps) and on the default SmolLM2 model (logits and 32 greedy steps).
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>

#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "cuda_model_test_util.h"
#include "cuda_test_util.h"
#include "model/loader.h"
#include "synthetic/synthetic_model.h"
#include "synthetic/synthetic_weights.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace loom::cuda {
namespace {

using test::argmax;
using test::Driver;
using test::rounded_adapter;
using test::tiny_weights;

// The tiny models against the CPU: NMSE ~1e-4..1e-3 measured on the H100 (cuda_model_test_util.h).
constexpr double kEndToEndNmse = 2e-3;

void expect_logits_close(const ForwardResult& out, const ForwardResult& ref, const std::string& what,
                         double* worst_nmse = nullptr) {
  test::expect_logits_close(out, ref, what, kEndToEndNmse, worst_nmse);
}

class CudaTinyModels : public ::testing::TestWithParam<Architecture> {};

TEST_P(CudaTinyModels, MatchCpuBackendWithAdaptersOverPrefillDecodeAndChunkedSteps) {
  LOOM_REQUIRE_GPU();
  const ModelConfig config = synthetic_model_config(GetParam(), SyntheticPreset::kTiny);
  const uint64_t seed = 11;
  auto reference_weights = tiny_weights(config, seed, true);
  auto cpu = make_cpu_backend(config, reference_weights);
  auto gpu = make_cuda_backend(config, *tiny_weights(config, seed, false));
  const int block_size = 16;
  cpu->allocate_kv_cache({256, block_size});
  gpu->allocate_kv_cache({256, block_size});

  SyntheticModelOptions options;
  options.arch = GetParam();
  options.num_adapters = 4;
  options.rank = 8;
  const std::vector<SyntheticAdapterSpec> specs = synthetic_adapter_specs(options, config);
  for (int slot = 0; slot < 4; ++slot) {
    auto adapter = std::make_shared<LoraAdapter>(make_synthetic_adapter(specs[slot], config, seed));
    cpu->set_adapter(slot, rounded_adapter(*adapter));
    gpu->set_adapter(slot, adapter);
  }

  Driver driver(256, block_size, 5);
  const int vocab = config.vocab_size;
  const int lengths[] = {1, 7, 16, 33, 50};
  const int32_t slots[] = {-1, 0, 1, 2, 3};
  std::vector<Driver::Part> prefill;
  for (int s = 0; s < 5; ++s) {
    driver.add_sequence();
    prefill.push_back({s, driver.random_tokens(lengths[s], vocab), std::vector<int32_t>(lengths[s], slots[s]), s == 3});
  }
  double worst_nmse = 0.0;
  const Batch first = driver.make_batch(prefill);
  expect_logits_close(gpu->forward(first), cpu->forward(first), "prefill", &worst_nmse);

  for (int step = 0; step < 4; ++step) {
    std::vector<Driver::Part> decode;
    for (int s = 0; s < 5; ++s) decode.push_back({s, driver.random_tokens(1, vocab), {slots[s]}, false});
    const Batch batch = driver.make_batch(decode);
    expect_logits_close(gpu->forward(batch), cpu->forward(batch), "decode " + std::to_string(step), &worst_nmse);
  }

  // Chunked continuation, an activated-style slot switch inside a sequence, and decodes.
  std::vector<Driver::Part> mixed;
  std::vector<int32_t> switching(20, -1);
  std::fill(switching.begin() + 9, switching.end(), 2);
  mixed.push_back({0, driver.random_tokens(20, vocab), switching, true});
  mixed.push_back({4, driver.random_tokens(1, vocab), {3}, false});
  driver.add_sequence();
  mixed.push_back({5, driver.random_tokens(70, vocab), std::vector<int32_t>(70, 1), false});
  const Batch last = driver.make_batch(mixed);
  expect_logits_close(gpu->forward(last), cpu->forward(last), "mixed", &worst_nmse);

  // Decode steps of 1 to 3 rows take the skinny GEMM path (with and without LoRA).
  for (int rows = 1; rows <= 3; ++rows) {
    std::vector<Driver::Part> few;
    for (int s = 0; s < rows; ++s) {
      const int sequence = s + 2 - rows / 2;
      const int32_t slot = rows == 2 ? -1 : slots[sequence];  // 2 rows without LoRA: the fused SwiGLU kernel
      few.push_back({sequence, driver.random_tokens(1, vocab), {slot}, false});
    }
    const Batch batch = driver.make_batch(few);
    expect_logits_close(gpu->forward(batch), cpu->forward(batch), "skinny " + std::to_string(rows), &worst_nmse);
  }
  std::printf("[ %s ] worst logits NMSE vs CPU (bf16 weights): %.3g\n", architecture_short_name(GetParam()), worst_nmse);
}

INSTANTIATE_TEST_SUITE_P(AllArchs, CudaTinyModels,
                         ::testing::Values(Architecture::kLlama, Architecture::kQwen2, Architecture::kQwen3,
                                           Architecture::kMistral),
                         [](const auto& info) { return std::string(architecture_short_name(info.param)); });

TEST(CudaBackend, SyntheticOnDeviceEqualsUploadedMakeModelWeights) {
  LOOM_REQUIRE_GPU();
  for (Architecture arch : {Architecture::kLlama, Architecture::kQwen2}) {
    const ModelConfig config = synthetic_model_config(arch, SyntheticPreset::kTiny);
    auto uploaded = make_cuda_backend(config, *tiny_weights(config, 3, false));
    auto drawn = make_synthetic_cuda_backend(config, 3, false);
    uploaded->allocate_kv_cache({64, 16});
    drawn->allocate_kv_cache({64, 16});
    Driver a(64, 16, 1), b(64, 16, 1);
    a.add_sequence();
    b.add_sequence();
    const std::vector<int32_t> tokens = a.random_tokens(40, config.vocab_size);
    const Batch batch_a = a.make_batch({{0, tokens, std::vector<int32_t>(40, -1), true}});
    const Batch batch_b = b.make_batch({{0, tokens, std::vector<int32_t>(40, -1), true}});
    EXPECT_EQ(uploaded->forward(batch_a).logits, drawn->forward(batch_b).logits) << architecture_short_name(arch);
  }
}

// The decode GEMM paths (skinny kernels for 1 row, cuBLAS) give the same
// logits for decode steps of 1, 2, 3 and 12 rows, with and without LoRA.
TEST(CudaBackend, DecodeGemmPathsAgree) {
  LOOM_REQUIRE_GPU();
  const ModelConfig config = synthetic_model_config(Architecture::kMistral, SyntheticPreset::kTiny);
  SyntheticModelOptions options;
  options.arch = Architecture::kMistral;
  options.num_adapters = 1;
  const auto specs = synthetic_adapter_specs(options, config);
  auto adapter = std::make_shared<LoraAdapter>(make_synthetic_adapter(specs[0], config, 4));
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<Driver> drivers;
  for (const int32_t skinny_max_rows : {CudaTuning{}.skinny_max_rows, 0}) {  // serving's, then cuBLAS only
    CudaBackendConfig backend_config;
    backend_config.tuning.skinny_max_rows = skinny_max_rows;
    backends.push_back(make_synthetic_cuda_backend(config, 4, false, backend_config));
    backends.back()->allocate_kv_cache({64, 16});
    backends.back()->set_adapter(0, adapter);
    drivers.emplace_back(64, 16, 2);
    for (int s = 0; s < 12; ++s) drivers.back().add_sequence();
  }
  for (int rows : {12, 1, 2, 3}) {
    for (bool lora : {false, true}) {
      std::vector<ForwardResult> results;
      for (size_t b = 0; b < backends.size(); ++b) {
        std::vector<Driver::Part> step;
        for (int s = 0; s < rows; ++s)
          step.push_back({s, {(s * 7 + rows) % config.vocab_size}, {lora && s % 2 == 0 ? 0 : -1}, false});
        results.push_back(backends[b]->forward(drivers[b].make_batch(step)));
      }
      for (size_t b = 1; b < results.size(); ++b) {
        const test::Closeness c = test::compare(results[b].logits, results[0].logits);
        EXPECT_LE(c.nmse, 1e-4) << "path " << b << " rows " << rows << " lora " << lora << ": " << c.describe();
      }
    }
  }
}

TEST(CudaBackend, KvPresentEntriesAreReadButNeverWritten) {
  LOOM_REQUIRE_GPU();
  const ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  auto backend_owner = make_synthetic_cuda_backend(config, 1, false);
  auto* backend = static_cast<CudaBackend*>(backend_owner.get());
  backend->allocate_kv_cache({8, 16});
  Batch batch;
  batch.block_tables = {3, 5};
  BatchSequence sequence;
  sequence.num_new_tokens = 24;
  sequence.num_blocks = 2;
  batch.sequences = {sequence};
  for (int t = 0; t < 24; ++t) {
    batch.token_ids.push_back(t + 1);
    batch.positions.push_back(t);
    batch.adapter_slots.push_back(-1);
  }
  backend->forward(batch);
  const size_t pool = 8 * 16 * config.kv_size();
  const std::vector<float> k_before = test::download_bf16(backend->k_pool(1), pool);

  // Re-run tokens 10..23 with other ids: entries below 20 are present (shared), 20.. are written.
  Batch again = batch;
  again.sequences[0].num_computed_tokens = 10;
  again.sequences[0].num_new_tokens = 14;
  again.sequences[0].num_kv_present_tokens = 20;
  again.token_ids.assign(14, 100);
  again.positions.resize(14);
  std::iota(again.positions.begin(), again.positions.end(), 10);
  again.adapter_slots.assign(14, -1);
  backend->forward(again);
  const std::vector<float> k_after = test::download_bf16(backend->k_pool(1), pool);
  auto slot_of = [&](int j) { return batch.block_tables[j / 16] * 16 + j % 16; };
  for (int j = 0; j < 24; ++j) {
    bool same = true;
    for (int h = 0; h < config.num_kv_heads; ++h) {
      const int64_t first = kv_element_index(slot_of(j), h, 16, config.num_kv_heads, config.head_dim);
      same = same && std::equal(k_before.begin() + first, k_before.begin() + first + config.head_dim,
                                k_after.begin() + first);
    }
    EXPECT_EQ(same, j < 20) << "entry " << j;
  }
}

TEST(CudaBackend, RejectsWhatItDoesNotServe) {
  LOOM_REQUIRE_GPU();
  const ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  auto backend = make_synthetic_cuda_backend(config, 1, false);
  backend->allocate_kv_cache({8, 16});
  Batch batch;
  batch.block_tables = {1};
  BatchSequence sequence;
  sequence.num_new_tokens = 2;
  sequence.num_blocks = 1;
  batch.sequences = {sequence};
  batch.token_ids = {1, 2};
  batch.positions = {0, 1};
  batch.adapter_slots = {-1, -1};
  Batch unbound = batch;  // base sharing with an adapter slot nothing is bound to
  unbound.sequences[0].decoder_adapter_slot = 0;
  loom::test::expect_error([&] { backend->forward(unbound); }, ErrorKind::kInvalidArgument, {"decoder_adapter_slot"});
  SyntheticModelOptions options;
  options.num_adapters = 1;
  backend->set_adapter(0, std::make_shared<LoraAdapter>(
                              make_synthetic_adapter(synthetic_adapter_specs(options, config)[0], config, 1)));
  Batch forked = batch;  // forked sharing before any rCache is allocated
  forked.sequences[0].forked_adapter_slot = 0;
  forked.adapter_slots = {0, 0};
  loom::test::expect_error([&] { backend->forward(forked); }, ErrorKind::kInvalidArgument, {"no residual cache"});
  loom::test::expect_error([&] { backend->allocate_residual_cache({8, 16, kResidualMaxRank + 1}); },
                           ErrorKind::kUnsupported, {"max rank 65"});
  Batch bad_block = batch;
  bad_block.block_tables = {8};
  loom::test::expect_error([&] { backend->forward(bad_block); }, ErrorKind::kInvalidArgument, {"block id 8"});
  loom::test::expect_error([&] { backend->set_adapter(64, nullptr); }, ErrorKind::kInvalidArgument, {"slot 64"});
  EXPECT_EQ(backend->forward(batch).logits.size(), static_cast<size_t>(config.vocab_size));
}

// The default model, against the CPU backend with the model's own
// (fp32-dequantized) weights, on three prompts:
//   - last-position logits of the prompt: NMSE <= 1e-3;
//   - 32 greedy steps, free running: reported; where the two first differ the
//     CPU's top two must be within 0.1 (a near tie that bf16 weights may flip);
//   - 32 greedy steps, both fed the CPU's token: argmax equal at every step
//     except near ties (CPU top-2 gap < 0.1), at most 3 of the 96.
TEST(CudaSmolLM2, LogitsAndGreedyTokensMatchCpuBackend) {
  LOOM_REQUIRE_GPU();
  const std::string path = loom::test::smollm2_gguf_path();
  if (path.empty()) GTEST_SKIP() << "SmolLM2 GGUF not present (set LOOM_SMOLLM2_GGUF)";
  const LoadedModel model = load_model(path);
  auto cpu = make_cpu_backend(model.config, model.weights);
  auto gpu = make_cuda_backend(model.config, *model.weights);
  cpu->allocate_kv_cache({1024, 16});
  gpu->allocate_kv_cache({1024, 16});
  const char* prompts[] = {"The capital of France is", "def fibonacci(n):\n    ",
                           "Once upon a time, in a small village by the sea,"};
  const int vocab = model.config.vocab_size;
  Driver cpu_driver(1024, 16, 1), gpu_driver(1024, 16, 1);
  int free_running_identical = 0, forced_flips = 0;
  for (int p = 0; p < 3; ++p) {
    const std::vector<int32_t> prompt = model.tokenizer->encode(prompts[p], true);
    const std::vector<int32_t> base_slots(prompt.size(), -1);
    for (bool forced : {false, true}) {
      const int cs = cpu_driver.add_sequence();
      const int gs = gpu_driver.add_sequence();
      ForwardResult cpu_out = cpu->forward(cpu_driver.make_batch({{cs, prompt, base_slots, false}}));
      ForwardResult gpu_out = gpu->forward(gpu_driver.make_batch({{gs, prompt, base_slots, false}}));
      if (!forced) {
        const test::Closeness c = test::compare(gpu_out.logits, cpu_out.logits);
        std::printf("[ smollm2 ] prompt %d: last-position logits NMSE %.3g, max |err| %.3g\n", p, c.nmse, c.max_abs_error);
        EXPECT_LE(c.nmse, 1e-3) << "prompt " << p;
      }
      for (int step = 0; step < 32; ++step) {
        const int cpu_token = argmax(cpu_out.logits.data(), vocab);
        const int gpu_token = argmax(gpu_out.logits.data(), vocab);
        const float gap = cpu_out.logits[cpu_token] - cpu_out.logits[gpu_token];
        if (cpu_token != gpu_token) {
          EXPECT_LT(gap, 0.1f) << "prompt " << p << " step " << step << (forced ? " (forced)" : "") << ": not a near tie";
          if (forced) {
            ++forced_flips;
            std::printf("[ smollm2 ] prompt %d forced step %d: argmax differs at a near tie (gap %.4f)\n", p, step, gap);
          } else {
            std::printf("[ smollm2 ] prompt %d free-running diverges at step %d (CPU top-2 gap %.4f)\n", p, step, gap);
            break;
          }
        } else if (!forced) {
          ++free_running_identical;
        }
        cpu_out = cpu->forward(cpu_driver.make_batch({{cs, {cpu_token}, {-1}, false}}));
        gpu_out = gpu->forward(gpu_driver.make_batch({{gs, {forced ? cpu_token : gpu_token}, {-1}, false}}));
      }
    }
  }
  std::printf("[ smollm2 ] free running: %d of 96 greedy steps identical; teacher-forced: %d of 96 differ (near ties)\n",
              free_running_identical, forced_flips);
  EXPECT_LE(forced_flips, 3);
}

}  // namespace
}  // namespace loom::cuda
