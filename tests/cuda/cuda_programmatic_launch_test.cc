// Programmatic dependent launches (launch.cuh, CudaTuning::
// programmatic_max_rows) change when kernels start, never what they compute:
// LoRA-free steps give bit-identical logits and device draws with them on and
// off, eager and replayed from CUDA graphs, at one and two rows (the skinny
// GEMMs, whose first weight loads run before the wait) and at five (cuBLAS),
// over contexts long enough for split-KV attention and its combine. The 8B
// shape's widths (two layers) make the GEMMs run several waves of CTAs, as in
// serving. The ping-pong prefill kernel (CudaTuning::pingpong_prefill)
// computes what the wgmma one does, bit for bit, so a backend with it joins the
// comparison: the 1.5K-token and joint prefills run wide. Reading weights ahead
// into L2 (CudaTuning::l2_prefetch) in captured steps changes nothing
// either, nor do the defaults (both on up to two rows). Last, two LoRA sequences
// join, with LoRA inline (CudaTuning::lora_side_stream off), where LoRA steps launch
// programmatically.
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/cuda/cuda_backend_impl.h"
#include "cuda_model_test_util.h"
#include "cuda_test_util.h"
#include "synthetic/synthetic_model.h"
#include "test_util.h"

namespace loom::cuda {
namespace {

using test::argmax;
using test::Driver;

constexpr int kBlockSize = 16;
constexpr int kNumBlocks = 512;

std::string first_difference(const std::vector<float>& got, const std::vector<float>& expected) {
  if (got.size() != expected.size()) return "sizes " + std::to_string(got.size()) + " vs " + std::to_string(expected.size());
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != expected[i])  // bit-for-bit: NaNs never come out of these steps
      return "index " + std::to_string(i) + ": " + std::to_string(got[i]) + " vs " + std::to_string(expected[i]);
  return "";
}

TEST(CudaProgrammaticLaunch, StepsEqualPlainLaunchesBitForBit) {
  LOOM_REQUIRE_GPU();
  ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::k8b);
  config.num_layers = 2;
  const int vocab = config.vocab_size;
  // Each variant is checked against the plain launches of its own kind (graphs
  // pad decode plans, which may move a reduction's order against eager steps).
  struct Variant {
    const char* name;
    bool programmatic, graphs, pingpong;
    int baseline;
    bool l2_prefetch = false;  // the read-ahead at every step size
    bool defaults = false;     // CudaTuning's defaults (both on at 1-2 rows)
  };
  const Variant variants[] = {{"plain, graphs", false, true, false, 0},
                              {"programmatic, graphs", true, true, false, 0},
                              {"plain, eager", false, false, false, 2},
                              {"programmatic, eager", true, false, false, 2},
                              {"programmatic, graphs, ping-pong prefill", true, true, true, 0},
                              {"plain, graphs, L2 prefetch", false, true, false, 0, true},
                              {"defaults, graphs", true, true, true, 0, false, true}};
  std::vector<std::unique_ptr<CudaBackend>> backends;
  std::vector<Driver> drivers;
  for (const Variant& variant : variants) {
    CudaBackendConfig backend_config;
    CudaTuning& tuning = backend_config.tuning;
    if (!variant.defaults) {
      tuning.programmatic_max_rows = variant.programmatic ? 1 << 30 : 0;
      tuning.l2_prefetch = variant.l2_prefetch ? CudaTuning::L2Prefetch{32 << 20, 8 << 20, 8 << 20, 1 << 20}
                                               : CudaTuning::L2Prefetch{0, 0, 0, 0};
    }
    tuning.cuda_graphs = variant.graphs;
    tuning.pingpong_prefill = variant.pingpong;
    // LoRA steps below run inline on the main stream (no side-stream events),
    // so that they launch programmatically too.
    tuning.lora_side_stream = false;
    backends.push_back(make_synthetic_cuda_backend_impl(config, 3, true, backend_config));
    backends.back()->allocate_kv_cache({kNumBlocks, kBlockSize});
    drivers.emplace_back(kNumBlocks, kBlockSize, 17);
  }
  Driver prompt_source(kNumBlocks, kBlockSize, 5);

  // Runs `parts` on every backend (device greedy draws on rows `sampled`) and
  // checks the others against the plain one; returns the next token per part.
  auto step = [&](const std::vector<Driver::Part>& parts, const std::vector<int>& sampled, const std::string& what) {
    std::vector<ForwardResult> results;
    for (size_t b = 0; b < backends.size(); ++b) {
      Batch batch = drivers[b].make_batch(parts);
      if (!sampled.empty()) {
        batch.sampling.assign(parts.size(), DeviceSampling{});
        for (int row : sampled) batch.sampling[row].on_device = true;
      }
      results.push_back(backends[b]->forward(batch));
    }
    for (size_t b = 0; b < backends.size(); ++b) {
      const ForwardResult& expected = results[variants[b].baseline];
      if (static_cast<int>(b) == variants[b].baseline) continue;
      EXPECT_EQ(first_difference(results[b].logits, expected.logits), "") << variants[b].name << ", " << what;
      EXPECT_EQ(results[b].sampled_token_ids, expected.sampled_token_ids) << variants[b].name << ", " << what;
      EXPECT_EQ(results[b].sampled_logprobs, expected.sampled_logprobs) << variants[b].name << ", " << what;
    }
    std::vector<int32_t> next;
    for (size_t row = 0, host_row = 0; row < parts.size(); ++row) {
      const bool on_device = !results[0].sampled_token_ids.empty() && results[0].sampled_token_ids[row] >= 0;
      next.push_back(on_device ? results[0].sampled_token_ids[row]
                               : argmax(results[0].logits.data() + host_row++ * vocab, vocab));
    }
    return next;
  };
  auto decode_parts = [](const std::vector<int>& ids, const std::vector<int32_t>& tokens) {
    std::vector<Driver::Part> parts;
    for (size_t i = 0; i < ids.size(); ++i) parts.push_back({ids[i], {tokens[i]}, {-1}, false});
    return parts;
  };

  // One sequence: a 1.5K-token prompt, then single-row decode steps.
  std::vector<int> ids;
  for (Driver& driver : drivers) ids.assign(1, driver.add_sequence());
  std::vector<int32_t> prompt = prompt_source.random_tokens(1500, vocab);
  std::vector<int32_t> next = step({{ids[0], prompt, std::vector<int32_t>(prompt.size(), -1), false}}, {}, "prefill 1");
  ASSERT_GT(backends[4]->plan().num_wide_prefill_items(), 0) << "the prompt runs wide";
  for (int s = 0; s < 6; ++s)
    next = step(decode_parts(ids, next), s % 2 == 1 ? std::vector<int>{0} : std::vector<int>{}, "1 row, step " + std::to_string(s));

  // A second sequence joins (a prefill beside the first one's decode), then two-row decode steps.
  std::vector<Driver::Part> pair = decode_parts(ids, next);
  {
    int id = -1;
    for (Driver& driver : drivers) id = driver.add_sequence();
    ids.push_back(id);
    std::vector<int32_t> tokens = prompt_source.random_tokens(70, vocab);
    pair.push_back({id, tokens, std::vector<int32_t>(tokens.size(), -1), false});
  }
  next = step(pair, {}, "prefill 1 + decode 1");
  for (int s = 0; s < 4; ++s)
    next = step(decode_parts(ids, next), s % 2 == 1 ? std::vector<int>{1} : std::vector<int>{},
                "2 rows, step " + std::to_string(s));

  // Three more sequences join (a prefill step beside the others' decode), then five-row decode steps.
  std::vector<Driver::Part> joint = decode_parts(ids, next);
  for (int length : {300, 900, 40}) {
    int id = -1;
    for (Driver& driver : drivers) id = driver.add_sequence();
    ids.push_back(id);
    std::vector<int32_t> tokens = prompt_source.random_tokens(length, vocab);
    joint.push_back({id, tokens, std::vector<int32_t>(tokens.size(), -1), false});
  }
  next = step(joint, {}, "prefill 3 + decode 2");
  for (int s = 0; s < 6; ++s)
    next = step(decode_parts(ids, next), s % 2 == 1 ? std::vector<int>{0, 2} : std::vector<int>{},
                "5 rows, step " + std::to_string(s));

  // LoRA inline on the main stream (no side-stream events): those steps launch
  // programmatically too, the shrink and expand kernels included.
  const std::vector<std::shared_ptr<const LoraAdapter>> adapters = test::synthetic_adapters(config, 2, 9);
  for (auto& backend : backends)
    for (int a = 0; a < 2; ++a) backend->set_adapter(a, adapters[a]);
  std::vector<Driver::Part> lora_joint = decode_parts(ids, next);
  std::vector<int32_t> slots(ids.size(), -1);
  for (int32_t slot : {0, 1}) {
    int id = -1;
    for (Driver& driver : drivers) id = driver.add_sequence();
    ids.push_back(id);
    slots.push_back(slot);
    std::vector<int32_t> tokens = prompt_source.random_tokens(200, vocab);
    lora_joint.push_back({id, tokens, std::vector<int32_t>(tokens.size(), slot), false});
  }
  next = step(lora_joint, {}, "LoRA prefill 2 + decode 5");
  for (int s = 0; s < 4; ++s) {
    std::vector<Driver::Part> parts;
    for (size_t i = 0; i < ids.size(); ++i) parts.push_back({ids[i], {next[i]}, {slots[i]}, false});
    next = step(parts, s % 2 == 1 ? std::vector<int>{1, 4} : std::vector<int>{}, "7 rows, 2 with LoRA, step " + std::to_string(s));
  }

  EXPECT_GE(backends[1]->graph_stats().replays, 4) << "the programmatic steps were replayed from graphs";
  EXPECT_EQ(backends[3]->graph_stats().replays, 0);
  EXPECT_GE(backends[5]->graph_stats().replays, 4) << "the prefetching steps were replayed from graphs";
  EXPECT_GE(backends[6]->graph_stats().replays, 4);
}

}  // namespace
}  // namespace loom::cuda
