// tools/divergence: the exact cases measure ~0, the lossy ones measure
// something, and only from the second layer on; the metric helpers; the
// random adapters' scale.
#include "tools/divergence.h"

#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "reference_model.h"
#include "util/error.h"

// DivergenceStats are filled with designated initializers, leaving the per-position vectors out.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace loom {
namespace {

constexpr int kReader = 0;
constexpr int kWriter = 1;
//                                                q  k  v  o  gate up down
constexpr std::array<int, kNumLoraTargets> kAllModules = {8, 4, 2, 6, 3, 5, 7};
constexpr std::array<int, kNumLoraTargets> kNoKv = {4, 0, 0, 4, 2, 2, 2};

struct TinyModel {
  ModelConfig config = test::tiny_config(Architecture::kLlama);
  std::shared_ptr<ModelWeights> weights = test::random_weights(config, 91);
  std::unique_ptr<Backend> backend = make_cpu_backend(config, weights, {.num_threads = 0, .max_adapter_slots = 4});
  // 21 tokens: the context ends inside a block of 4, so continuations share its last block.
  DivergencePrompt prompt{test::random_tokens(92, 21, config.vocab_size),
                          test::random_tokens(93, 6, config.vocab_size)};
  DivergenceOptions options{.num_generated_tokens = 8, .block_size = 4, .residual_max_rank = 8};
};

void expect_exact(const DivergenceStats& stats, const std::string& what) {
  ASSERT_EQ(stats.layer_cosine.size(), 3u) << what;
  for (double cosine : stats.layer_cosine) EXPECT_GT(cosine, 1.0 - 1e-6) << what;
  EXPECT_LT(stats.mean_kl, 1e-8) << what;
  EXPECT_LT(stats.max_kl, 1e-7) << what;
  EXPECT_EQ(stats.num_positions, 6 + 8 - 1) << what;
  EXPECT_EQ(stats.teacher_forced_agreement, 1.0) << what;
  EXPECT_EQ(stats.free_running_agreement, 1.0) << what;
  EXPECT_EQ(stats.first_divergence, 8) << what;
  EXPECT_EQ(stats.mode_tokens, stats.reference_tokens) << what;
  EXPECT_EQ(stats.kl_by_position.size(), 13u) << what;
}

TEST(Divergence, ForkedOnItsOwnBaseCacheAndActivatedAreExact) {
  TinyModel setup;
  setup.backend->set_adapter(kReader, test::random_adapter(setup.config, 94, kAllModules, 16.0f));
  const std::vector<DivergenceStats> stats =
      measure_divergence(*setup.backend, setup.config, setup.prompt, kReader,
                         {{DivergenceMode::kForked, ForkedWriter::kSelf}, {DivergenceMode::kActivated}}, setup.options);
  ASSERT_EQ(stats.size(), 2u);
  expect_exact(stats[0], "forked/self");
  expect_exact(stats[1], "activated");
}

// An adapter without k/v LoRA: every layer-0 K/V is the base model's, so
// reading inherited K/V is exact through layer 0 and lossy after it.
TEST(Divergence, InheritedKvDivergesFromTheSecondLayerOn) {
  TinyModel setup;
  setup.backend->set_adapter(kReader, test::random_adapter(setup.config, 95, kNoKv, 16.0f));
  setup.backend->set_adapter(kWriter, test::random_adapter(setup.config, 96, kAllModules, 16.0f));
  const std::vector<DivergenceCase> cases = {{DivergenceMode::kBase},
                                             {DivergenceMode::kForked, ForkedWriter::kBaseModel},
                                             {DivergenceMode::kForked, ForkedWriter::kAdapter, kWriter},
                                             {DivergenceMode::kBaseModel}};
  const std::vector<DivergenceStats> stats =
      measure_divergence(*setup.backend, setup.config, setup.prompt, kReader, cases, setup.options);
  ASSERT_EQ(stats.size(), cases.size());
  for (size_t i = 0; i < 3; ++i) {
    const std::string what = std::string(divergence_mode_name(cases[i].mode)) + " " + forked_writer_name(cases[i].writer);
    EXPECT_GT(stats[i].layer_cosine[0], 1.0 - 1e-9) << what;
    EXPECT_GT(stats[i].layer_cosine[1], 1.0 - 1e-6) << what;
    EXPECT_LT(stats[i].layer_cosine[2], 1.0 - 1e-5) << what;
    EXPECT_GT(stats[i].mean_kl, 1e-4) << what;
    EXPECT_GE(stats[i].max_kl, stats[i].mean_kl) << what;
  }
  for (const DivergenceStats& s : stats) {  // one isolated reference for all four
    EXPECT_EQ(s.reference_tokens, stats[0].reference_tokens);
    EXPECT_EQ(s.mode_tokens.size(), 8u);
  }
  // Ignoring the adapter altogether already differs at layer 0, and more than sharing does.
  EXPECT_LT(stats[3].layer_cosine[1], 1.0 - 1e-4);
  EXPECT_GT(stats[3].mean_kl, stats[0].mean_kl);
  EXPECT_LT(stats[3].teacher_forced_agreement, 1.0);
}

TEST(Divergence, CachesAreReallocatedAndTheResultRepeats) {
  TinyModel setup;
  setup.backend->set_adapter(kReader, test::random_adapter(setup.config, 97, kAllModules, 16.0f));
  const std::vector<DivergenceCase> cases = {{DivergenceMode::kBase}};
  setup.backend->allocate_kv_cache({2, 16});  // too small, other block size
  const DivergenceStats first =
      measure_divergence(*setup.backend, setup.config, setup.prompt, kReader, cases, setup.options)[0];
  EXPECT_EQ(setup.backend->kv_cache_shape().block_size, 4);
  const DivergenceStats second =
      measure_divergence(*setup.backend, setup.config, setup.prompt, kReader, cases, setup.options)[0];
  EXPECT_EQ(first.layer_cosine, second.layer_cosine);
  EXPECT_EQ(first.mean_kl, second.mean_kl);
}

TEST(Divergence, RejectsBadInput) {
  TinyModel setup;
  setup.backend->set_adapter(kReader, test::random_adapter(setup.config, 98, kAllModules, 16.0f));
  auto kind_of = [&](const DivergencePrompt& prompt, const DivergenceCase& c, DivergenceOptions options) {
    try {
      measure_divergence(*setup.backend, setup.config, prompt, kReader, {c}, options);
    } catch (const Error& error) {
      return error.kind();
    }
    return ErrorKind::kInternal;
  };
  EXPECT_EQ(kind_of({setup.prompt.context, {}}, {DivergenceMode::kBase}, setup.options), ErrorKind::kInvalidArgument);
  DivergenceOptions no_rank = setup.options;
  no_rank.residual_max_rank = 0;
  EXPECT_EQ(kind_of(setup.prompt, {DivergenceMode::kForked}, no_rank), ErrorKind::kInvalidArgument);
  EXPECT_EQ(kind_of(setup.prompt, {DivergenceMode::kForked, ForkedWriter::kAdapter, -1}, setup.options),
            ErrorKind::kInvalidArgument);
  DivergenceOptions no_tokens = setup.options;
  no_tokens.num_generated_tokens = 0;
  EXPECT_EQ(kind_of(setup.prompt, {DivergenceMode::kBase}, no_tokens), ErrorKind::kInvalidArgument);
}

TEST(Divergence, KlAndCosine) {
  const float p[] = {0.0f, std::log(3.0f)};  // (1/4, 3/4)
  const float q[] = {0.0f, 0.0f};            // (1/2, 1/2)
  EXPECT_NEAR(logit_kl_divergence(p, q, 2), 0.25 * std::log(0.5) + 0.75 * std::log(1.5), 1e-7);
  EXPECT_NEAR(logit_kl_divergence(q, p, 2), 0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0), 1e-7);
  const float shifted[] = {5.0f, 5.0f + std::log(3.0f)};  // softmax is shift invariant
  EXPECT_NEAR(logit_kl_divergence(p, shifted, 2), 0.0, 1e-7);

  const float a[] = {1.0f, 2.0f, 0.0f};
  const float b[] = {2.0f, 4.0f, 0.0f};
  const float c[] = {-2.0f, 1.0f, 5.0f};
  const float zero[] = {0.0f, 0.0f, 0.0f};
  EXPECT_NEAR(cosine_similarity(a, b, 3), 1.0, 1e-12);
  EXPECT_NEAR(cosine_similarity(a, c, 3), 0.0, 1e-12);
  EXPECT_EQ(cosine_similarity(zero, zero, 3), 1.0);
  EXPECT_EQ(cosine_similarity(a, zero, 3), 0.0);
}

TEST(Divergence, AverageWeightsByPositions) {
  DivergenceStats one{.layer_cosine = {1.0, 0.9}, .mean_kl = 0.1, .max_kl = 0.5, .num_positions = 10,
                      .num_generated_tokens = 4, .teacher_forced_agreement = 1.0, .free_running_agreement = 0.5,
                      .first_divergence = 2};
  DivergenceStats two{.layer_cosine = {1.0, 0.6}, .mean_kl = 0.4, .max_kl = 0.7, .num_positions = 20,
                      .num_generated_tokens = 12, .teacher_forced_agreement = 0.5, .free_running_agreement = 0.25,
                      .first_divergence = 3};
  const DivergenceStats mean = average_divergence({one, two});
  EXPECT_NEAR(mean.layer_cosine[1], (0.9 * 10 + 0.6 * 20) / 30, 1e-12);
  EXPECT_NEAR(mean.mean_kl, (0.1 * 10 + 0.4 * 20) / 30, 1e-12);
  EXPECT_EQ(mean.max_kl, 0.7);
  EXPECT_NEAR(mean.teacher_forced_agreement, (4 + 6) / 16.0, 1e-12);
  EXPECT_NEAR(mean.free_running_agreement, (2 + 3) / 16.0, 1e-12);
  EXPECT_EQ(mean.num_positions, 30);
  EXPECT_EQ(average_divergence({}).layer_cosine.size(), 0u);
}

// ||s B A||_F / ||W||_F comes out near the requested relative norm; a fixed sigma is B's std.
TEST(Divergence, RandomLoraScale) {
  const ModelConfig config = test::tiny_config(Architecture::kLlama);
  const auto weights = test::random_weights(config, 99);
  RandomLoraOptions options;
  options.rank = 4;
  options.relative_norm = 0.3f;
  const RandomLora lora = make_random_lora(config, weights.get(), options);
  const Tensor* base[kNumLoraTargets] = {&weights->layers[1].q_proj,    &weights->layers[1].k_proj,
                                         &weights->layers[1].v_proj,    &weights->layers[1].o_proj,
                                         &weights->layers[1].gate_proj, &weights->layers[1].up_proj,
                                         &weights->layers[1].down_proj};
  double sum_ratio = 0.0;
  for (int t = 0; t < kNumLoraTargets; ++t) {
    const LoraModuleWeights& module = *lora.adapter->layers[1][t];
    const int64_t out = module.b.shape[0], in = module.a.shape[1], rank = module.rank;
    double delta = 0.0, w = 0.0;
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double sum = 0.0;
        for (int64_t r = 0; r < rank; ++r) sum += module.b.data[o * rank + r] * module.a.data[r * in + i];
        delta += module.scale * module.scale * sum * sum;
        w += static_cast<double>(base[t]->data[o * in + i]) * base[t]->data[o * in + i];
      }
    sum_ratio += std::sqrt(delta / w);
    EXPECT_GT(lora.mean_b_sigma[t], 0.0);
  }
  EXPECT_NEAR(sum_ratio / kNumLoraTargets, 0.3, 0.06);

  options.b_sigma = 0.05f;
  options.name = "other";
  const RandomLora fixed = make_random_lora(config, weights.get(), options);
  const Tensor& b = fixed.adapter->layers[0][static_cast<int>(LoraTarget::kDown)]->b;
  double squares = 0.0;
  for (int64_t i = 0; i < b.numel(); ++i) squares += static_cast<double>(b.data[i]) * b.data[i];
  EXPECT_NEAR(std::sqrt(squares / b.numel()), 0.05, 0.01);
  EXPECT_NE(b.data[0], lora.adapter->layers[0][static_cast<int>(LoraTarget::kDown)]->b.data[0]);
}

}  // namespace
}  // namespace loom
