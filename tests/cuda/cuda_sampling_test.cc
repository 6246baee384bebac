// Device sampling (sampling.h, backend.h DeviceSampling): greedy against the
// argmax, top-k = 1 against greedy, sampled frequencies against the host
// Sampler's distribution (softmax(logits / T) cut by top-k then top-p) by a
// chi-square test, reproducibility by (seed, step), and the backend path.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <span>

#include <gtest/gtest.h>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/sampling.h"
#include "backend/cuda/step_plan.h"
#include "cuda_test_util.h"
#include "synthetic/synthetic_model.h"
#include "util/error.h"

namespace loom::cuda {
namespace {

using test::random_values;

SamplingRow make_row(float temperature, int top_k, float top_p, uint64_t seed, uint64_t step) {
  return {1,
          temperature,
          top_k,
          top_p,
          static_cast<uint32_t>(seed),
          static_cast<uint32_t>(seed >> 32),
          static_cast<uint32_t>(step),
          static_cast<uint32_t>(step >> 32)};
}

struct Draws {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

// Samples every row of `logits` ([rows.size(), vocab]) on the device.
Draws sample(const std::vector<float>& logits, int vocab, const std::vector<SamplingRow>& rows) {
  const int num_rows = static_cast<int>(rows.size());
  DeviceBuffer device_logits = test::upload_f32(logits);
  DeviceBuffer device_rows(rows.size() * sizeof(SamplingRow));
  LOOM_CUDA_CHECK(cudaMemcpy(device_rows.data(), rows.data(), device_rows.size(), cudaMemcpyHostToDevice));
  DeviceBuffer out(static_cast<size_t>(num_rows) * 8);
  LOOM_CUDA_CHECK(cudaMemset(out.data(), 0x7f, out.size()));  // poison
  launch_sampling(device_logits.as<float>(), num_rows, vocab, device_rows.as<SamplingRow>(), out.as<int32_t>(),
                  reinterpret_cast<float*>(out.as<int32_t>() + num_rows), nullptr);
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int32_t> words(static_cast<size_t>(num_rows) * 2);
  LOOM_CUDA_CHECK(cudaMemcpy(words.data(), out.data(), out.size(), cudaMemcpyDeviceToHost));
  Draws draws;
  draws.tokens.assign(words.begin(), words.begin() + num_rows);
  for (int r = 0; r < num_rows; ++r) {
    float value;
    std::memcpy(&value, &words[num_rows + r], sizeof(float));
    draws.logprobs.push_back(value);
  }
  return draws;
}

double log_softmax_at(const float* row, int vocab, int id) {
  const double max = *std::max_element(row, row + vocab);
  double sum = 0.0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(row[i] - max);
  return row[id] - max - std::log(sum);
}

int argmax_lowest(const float* row, int vocab) {
  int best = 0;
  for (int i = 1; i < vocab; ++i)
    if (row[i] > row[best]) best = i;
  return best;
}

// The host Sampler's distribution (engine/sampler.cc): ids sorted by logit
// (ties by id), top_k kept, tempered weights, the first prefix reaching top_p.
std::map<int, double> reference_distribution(const std::vector<float>& row, float temperature, int top_k, float top_p) {
  std::vector<int> ids(row.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return row[a] > row[b]; });
  size_t keep = ids.size();
  if (top_k > 0) keep = std::min(keep, static_cast<size_t>(top_k));
  std::vector<double> weights(keep);
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) total += weights[i] = std::exp((row[ids[i]] - row[ids[0]]) / temperature);
  if (top_p < 1.0f) {
    double cumulative = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += weights[i] / total;
      if (cumulative >= top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  total = std::accumulate(weights.begin(), weights.begin() + keep, 0.0);
  std::map<int, double> probabilities;
  for (size_t i = 0; i < keep; ++i) probabilities[ids[i]] = weights[i] / total;
  return probabilities;
}

// Chi-square quantile (Wilson-Hilferty) at upper tail 1e-4.
double chi_square_critical(int degrees) {
  const double z = 3.719, d = degrees;
  return d * std::pow(1.0 - 2.0 / (9.0 * d) + z * std::sqrt(2.0 / (9.0 * d)), 3.0);
}

TEST(CudaSampling, GreedyIsArgmaxTopK1IsGreedyAndLogprobIsLogSoftmax) {
  LOOM_REQUIRE_GPU();
  Prng prng(5);
  for (int vocab : {1003, 128256}) {
    const int num_rows = 5;
    std::vector<float> logits = random_values(prng, static_cast<size_t>(num_rows) * vocab, 8.0f, false);
    // Row 1: a tie for the max, the lower id must win.
    float* tied = logits.data() + vocab;
    tied[vocab / 3] = 20.0f;
    tied[vocab / 2] = 20.0f;
    std::vector<SamplingRow> rows = {make_row(0, 0, 1, 1, 0), make_row(0, 0, 1, 2, 0), make_row(1.0f, 1, 1, 3, 9),
                                     make_row(0, 50, 0.5f, 4, 1), SamplingRow{}};
    const Draws draws = sample(logits, vocab, rows);
    for (int r = 0; r < 4; ++r) {
      const float* row = logits.data() + static_cast<size_t>(r) * vocab;
      EXPECT_EQ(draws.tokens[r], argmax_lowest(row, vocab)) << "vocab " << vocab << " row " << r;
      EXPECT_NEAR(draws.logprobs[r], log_softmax_at(row, vocab, draws.tokens[r]), 1e-4) << "row " << r;
    }
    EXPECT_EQ(draws.tokens[1], vocab / 3);
    EXPECT_EQ(draws.tokens[4], -1) << "rows not on the device are left to the host";
  }
}

TEST(CudaSampling, SameSeedAndStepGiveTheSameTokenAnywhereInTheBatch) {
  LOOM_REQUIRE_GPU();
  Prng prng(6);
  const int vocab = 50000, num_rows = 64;
  const std::vector<float> one_row = random_values(prng, vocab, 3.0f, false);
  std::vector<float> logits;
  for (int r = 0; r < num_rows; ++r) logits.insert(logits.end(), one_row.begin(), one_row.end());
  std::vector<SamplingRow> rows;
  for (int r = 0; r < num_rows; ++r) rows.push_back(make_row(1.0f, r % 3 == 0 ? 0 : 200, r % 2 ? 0.9f : 1.0f, 1000 + r, r));
  for (int r : {0, 17, 63}) rows[r] = make_row(0.8f, 0, 0.95f, 7, 3);
  const Draws first = sample(logits, vocab, rows);
  EXPECT_EQ(first.tokens[0], first.tokens[17]);
  EXPECT_EQ(first.tokens[0], first.tokens[63]);
  // A second batch in another order draws the same tokens.
  std::vector<SamplingRow> reversed(rows.rbegin(), rows.rend());
  const Draws second = sample(logits, vocab, reversed);
  for (int r = 0; r < num_rows; ++r) EXPECT_EQ(second.tokens[num_rows - 1 - r], first.tokens[r]) << "row " << r;
  // Different (seed, step) pairs do not all land on one token.
  std::vector<int32_t> distinct = first.tokens;
  std::sort(distinct.begin(), distinct.end());
  EXPECT_GT(std::unique(distinct.begin(), distinct.end()) - distinct.begin(), 20);
  for (int r = 0; r < num_rows; ++r) {
    EXPECT_GE(first.tokens[r], 0);
    EXPECT_LT(first.tokens[r], vocab);
  }
}

struct FrequencyCase {
  int vocab;
  float temperature;
  int top_k;
  float top_p;
  bool with_ties;
};

void check_frequencies(const FrequencyCase& c, int num_draws, int rows_per_launch, uint64_t seed) {
  Prng prng(seed);
  std::vector<float> row = random_values(prng, c.vocab, c.vocab > 1000 ? 4.0f : 1.5f, false);
  if (c.vocab > 1000)  // a head of 30 likely tokens over a long flat tail
    for (int i = 0; i < 30; ++i) row[prng.next_below(c.vocab)] += 7.0f;
  if (c.with_ties) {  // equal logits across the top-k / top-p boundaries: lower ids first
    for (int i = 1; i < c.vocab; i += 3) row[i] = row[i - 1];
  }
  const std::map<int, double> expected = reference_distribution(row, c.temperature, c.top_k, c.top_p);
  std::vector<float> logits;
  for (int r = 0; r < rows_per_launch; ++r) logits.insert(logits.end(), row.begin(), row.end());
  std::map<int, int64_t> observed;
  for (int drawn = 0; drawn < num_draws; drawn += rows_per_launch) {
    std::vector<SamplingRow> rows;
    for (int r = 0; r < rows_per_launch; ++r) rows.push_back(make_row(c.temperature, c.top_k, c.top_p, seed, drawn + r));
    for (int32_t token : sample(logits, c.vocab, rows).tokens) ++observed[token];
  }
  const std::string label = "vocab " + std::to_string(c.vocab) + " T " + std::to_string(c.temperature) + " top_k " +
                            std::to_string(c.top_k) + " top_p " + std::to_string(c.top_p);
  for (const auto& [token, count] : observed)
    ASSERT_TRUE(expected.count(token)) << label << ": drew token " << token << " outside the kept set";
  // Chi-square over the kept tokens; those expected fewer than 5 times pooled.
  double statistic = 0.0, pooled_expected = 0.0, pooled_observed = 0.0;
  int categories = 0;
  for (const auto& [token, probability] : expected) {
    const double e = probability * num_draws;
    const double o = observed.count(token) ? static_cast<double>(observed[token]) : 0.0;
    if (e < 5.0) {
      pooled_expected += e;
      pooled_observed += o;
      continue;
    }
    statistic += (o - e) * (o - e) / e;
    ++categories;
  }
  if (pooled_expected > 0.0) {
    statistic += (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / std::max(pooled_expected, 1.0);
    ++categories;
  }
  ASSERT_GE(categories, 2) << label;
  EXPECT_LT(statistic, chi_square_critical(categories - 1))
      << label << ": chi-square " << statistic << " over " << categories << " categories";
}

TEST(CudaSampling, FrequenciesFollowTheTruncatedSoftmaxSmallVocab) {
  LOOM_REQUIRE_GPU();
  const FrequencyCase cases[] = {{24, 1.0f, 0, 1.0f, false},  {24, 0.7f, 6, 1.0f, false}, {24, 1.3f, 0, 0.8f, false},
                                 {24, 0.9f, 10, 0.7f, false}, {30, 1.0f, 7, 1.0f, true},  {30, 1.0f, 0, 0.6f, true},
                                 {37, 2.0f, 12, 0.9f, true}};
  uint64_t seed = 11;
  for (const FrequencyCase& c : cases) check_frequencies(c, 40000, 20000, seed++);
}

TEST(CudaSampling, FrequenciesFollowTheTruncatedSoftmaxLargeVocab) {
  LOOM_REQUIRE_GPU();
  check_frequencies({128256, 0.8f, 50, 0.9f, false}, 12288, 2048, 21);
  check_frequencies({128256, 1.0f, 0, 0.5f, false}, 8192, 2048, 22);
}

// Through the backend: device rows return tokens (greedy = argmax of the same
// step's logits), host rows their logits, packed.
TEST(CudaSampling, BackendReturnsTokensForDeviceRowsAndLogitsForTheRest) {
  LOOM_REQUIRE_GPU();
  const ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  auto backend = make_synthetic_cuda_backend(config, 2, false);
  ASSERT_TRUE(backend->supports_device_sampling());
  backend->allocate_kv_cache({16, 16});
  Batch batch;
  for (int s = 0; s < 3; ++s) {
    BatchSequence sequence;
    sequence.num_new_tokens = 5 + s;
    sequence.token_offset = batch.num_tokens();
    sequence.block_table_offset = s;
    sequence.num_blocks = 1;
    batch.sequences.push_back(sequence);
    batch.block_tables.push_back(2 * s + 1);
    for (int t = 0; t < sequence.num_new_tokens; ++t) {
      batch.token_ids.push_back((7 * t + 3 * s + 1) % config.vocab_size);
      batch.positions.push_back(t);
      batch.adapter_slots.push_back(-1);
    }
  }
  const ForwardResult plain = backend->forward(batch);
  ASSERT_EQ(plain.logits.size(), 3u * config.vocab_size);
  EXPECT_TRUE(plain.sampled_token_ids.empty());

  Batch sampled = batch;
  sampled.sampling.resize(3);
  sampled.sampling[0] = {true, 0.0f, 0, 1.0f, 1, 0};
  sampled.sampling[2] = {true, 0.5f, 1, 1.0f, 2, 5};
  const ForwardResult result = backend->forward(sampled);
  ASSERT_EQ(result.sampled_token_ids.size(), 3u);
  ASSERT_EQ(result.sampled_logprobs.size(), 3u);
  const int vocab = config.vocab_size;
  EXPECT_EQ(result.sampled_token_ids[0], argmax_lowest(plain.logits.data(), vocab));
  EXPECT_EQ(result.sampled_token_ids[1], -1);
  EXPECT_EQ(result.sampled_token_ids[2], argmax_lowest(plain.logits.data() + 2 * vocab, vocab));
  EXPECT_NEAR(result.sampled_logprobs[0], log_softmax_at(plain.logits.data(), vocab, result.sampled_token_ids[0]), 1e-4);
  ASSERT_EQ(result.logits.size(), static_cast<size_t>(vocab)) << "only the host row comes back";
  EXPECT_EQ(result.logits, std::vector<float>(plain.logits.begin() + vocab, plain.logits.begin() + 2 * vocab));

  Batch bad = sampled;
  bad.sampling[1] = {true, 1.0f, 0, 0.0f, 0, 0};
  try {
    backend->forward(bad);
    FAIL() << "top_p 0 accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::kInvalidArgument);
  }
  bad.sampling.resize(2);
  EXPECT_THROW(backend->forward(bad), Error);
}

// `count` fresh sequences of one token each (token stride * s + first), each in its own block.
Batch one_token_sequences(int count, int stride, int first) {
  Batch batch;
  for (int s = 0; s < count; ++s) {
    BatchSequence sequence;
    sequence.num_new_tokens = 1;
    sequence.token_offset = s;
    sequence.block_table_offset = s;
    sequence.num_blocks = 1;
    batch.sequences.push_back(sequence);
    batch.block_tables.push_back(2 * s + 1);
    batch.token_ids.push_back(stride * s + first);
    batch.positions.push_back(0);
    batch.adapter_slots.push_back(-1);
  }
  return batch;
}

// Structured outputs on the device (Backend::finish_forward's token masks): a
// wrong number of mask words is refused; a masked greedy row draws the best allowed token
// and its logprob is under the masked logits; rows without a mask, and steps
// replayed from a CUDA graph, are unaffected; a sampled row draws only allowed
// tokens.
TEST(CudaSampling, TokenMasksRestrictTheDrawToAllowedTokens) {
  LOOM_REQUIRE_GPU();
  const ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  auto backend = make_synthetic_cuda_backend(config, 2, false);
  backend->allocate_kv_cache({16, 16});
  const int vocab = config.vocab_size;
  const int words = (vocab + 31) / 32;
  const Batch batch = one_token_sequences(3, 11, 2);
  const ForwardResult plain = backend->forward(batch);
  // Allowed: row 0 every third token below vocab / 2 except its argmax; row 1 (sampled) ids 5..12.
  std::vector<uint32_t> allowed(2 * static_cast<size_t>(words), 0u);
  const int best0 = argmax_lowest(plain.logits.data(), vocab);
  for (int t = 0; t < vocab / 2; t += 3)
    if (t != best0) allowed[t / 32] |= 1u << (t % 32);
  for (int t = 5; t <= 12; ++t) allowed[words + t / 32] |= 1u << (t % 32);
  int expected0 = -1;
  for (int t = 0; t < vocab; ++t)
    if ((allowed[t / 32] >> (t % 32)) & 1u)
      if (expected0 < 0 || plain.logits[t] > plain.logits[expected0]) expected0 = t;

  for (int round = 0; round < 4; ++round) {  // eager, then graph-captured decode shapes replay
    Batch masked = batch;
    masked.sampling.resize(3);
    masked.sampling[0] = {true, 0.0f, 0, 1.0f, 1, 0, 0};
    masked.sampling[1] = {true, 1.0f, 0, 1.0f, 7, static_cast<uint64_t>(round), 1};
    masked.sampling[2] = {true, 0.0f, 0, 1.0f, 3, 0};
    masked.num_token_mask_rows = 2;
    if (round == 0) {
      EXPECT_THROW(backend->forward(masked), Error) << "mask rows need the two phases";
      backend->enqueue_forward(masked);
      EXPECT_THROW(backend->finish_forward(std::span<const uint32_t>(allowed).first(words)), Error)
          << "one row of masks for two";
    }
    backend->enqueue_forward(masked);
    const ForwardResult result = backend->finish_forward(allowed);
    ASSERT_EQ(result.sampled_token_ids.size(), 3u);
    EXPECT_EQ(result.sampled_token_ids[0], expected0);
    double sum = 0.0;  // logprob under the masked logits
    for (int t = 0; t < vocab; ++t)
      if ((allowed[t / 32] >> (t % 32)) & 1u) sum += std::exp(plain.logits[t] - plain.logits[expected0]);
    EXPECT_NEAR(result.sampled_logprobs[0], -std::log(sum), 1e-3);
    EXPECT_GE(result.sampled_token_ids[1], 5);
    EXPECT_LE(result.sampled_token_ids[1], 12);
    EXPECT_EQ(result.sampled_token_ids[2], argmax_lowest(plain.logits.data() + 2 * vocab, vocab)) << "no mask row";
  }
  Batch bad = batch;
  bad.sampling.resize(3);
  bad.sampling[0] = {true, 0.0f, 0, 1.0f, 1, 0, 0};
  EXPECT_THROW(backend->forward(bad), Error) << "a mask row without masks";
}

// Logit processing on the device (Batch::logit_edits, repetition_penalty,
// min_p): a greedy row takes the argmax of rep(logit + bias) - subtract with its
// logprob under the raw row; a row drawn at a temperature with min_p only takes
// tokens within min_p of the processed row's most likely one; rows without
// processing are untouched.
TEST(CudaSampling, LogitProcessingFollowsTheSamplerDefinitionAndKeepsRawLogprobs) {
  LOOM_REQUIRE_GPU();
  const ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  auto backend = make_synthetic_cuda_backend(config, 2, false);
  backend->allocate_kv_cache({16, 16});
  const int vocab = config.vocab_size;
  const Batch batch = one_token_sequences(3, 13, 5);
  const ForwardResult plain = backend->forward(batch);
  const float* raw0 = plain.logits.data();
  // Row 0 (greedy): the raw argmax pushed down, a low token lifted by a bias, one repeated token.
  const int best = argmax_lowest(raw0, vocab);
  std::vector<int> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return raw0[a] > raw0[b]; });
  const int second = order[1], low = order[vocab / 2];
  const float repetition = 1.7f;
  std::vector<LogitEdit> edits = {{best, 0.0f, 2.5f, 1}, {low, raw0[best] - raw0[low] + 0.25f, 0.0f, 0},
                                  {second, 0.0f, 0.0f, 1}};
  std::vector<float> adjusted(raw0, raw0 + vocab);
  for (const LogitEdit& edit : edits) {
    float value = adjusted[edit.token] + edit.bias;
    if (edit.repeated) value = value > 0.0f ? value / repetition : value * repetition;
    adjusted[edit.token] = value - edit.subtract;
  }
  const int expected0 = argmax_lowest(adjusted.data(), vocab);
  ASSERT_NE(expected0, best) << "the edits must change the choice for this test to mean anything";
  const float min_p = 0.3f, temperature = 0.8f;
  const float* raw1 = plain.logits.data() + vocab;
  const float max1 = *std::max_element(raw1, raw1 + vocab);
  for (int round = 0; round < 6; ++round) {
    Batch processed = batch;
    processed.logit_edits = edits;
    processed.sampling.resize(3);
    processed.sampling[0] = {true, 0.0f, 0, 1.0f, 1, 0, -1, repetition, 0.0f, 0, 3};
    processed.sampling[1] = {true, temperature, 0, 1.0f, 9, static_cast<uint64_t>(round), -1, 1.0f, min_p, 0, 0};
    processed.sampling[2] = {true, 0.0f, 0, 1.0f, 3, 0};
    const ForwardResult result = backend->forward(processed);
    ASSERT_EQ(result.sampled_token_ids.size(), 3u);
    EXPECT_EQ(result.sampled_token_ids[0], expected0);
    EXPECT_NEAR(result.sampled_logprobs[0], log_softmax_at(raw0, vocab, expected0), 1e-4) << "raw logprob";
    const int drawn = result.sampled_token_ids[1];
    ASSERT_GE(drawn, 0);
    EXPECT_GE((raw1[drawn] - max1) / temperature, std::log(min_p) - 1e-4f) << "round " << round << " drew " << drawn;
    EXPECT_NEAR(result.sampled_logprobs[1], log_softmax_at(raw1, vocab, drawn), 1e-4);
    EXPECT_EQ(result.sampled_token_ids[2], argmax_lowest(plain.logits.data() + 2 * vocab, vocab));
  }
  Batch bad = batch;
  bad.sampling.resize(3);
  bad.sampling[0] = {true, 0.0f, 0, 1.0f, 1, 0, -1, 1.0f, 0.0f, 0, 2};
  EXPECT_THROW(backend->forward(bad), Error) << "edits outside Batch::logit_edits";
}

}  // namespace
}  // namespace loom::cuda
