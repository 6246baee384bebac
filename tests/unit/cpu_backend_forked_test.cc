// Forked (ForkKV) sharing on the CPU backend: ResidualAttention against the
// isolated adapter and against a naive reference that builds K = bK + RoPE(s rK B_k)
// explicitly; write masks of present entries; partial hits.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "reference_model.h"
#include "util/error.h"

// SequenceInput is filled with designated initializers, leaving defaults out on purpose.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace loom {
namespace {

using test::make_batch;
using test::ReferenceRun;
using test::relative_diff;
using test::SequenceInput;

constexpr double kTolerance = 1e-4;  // relative, fp32 backend against the double reference
constexpr int kMaxRank = 8;
constexpr int kSlotA = 0;
constexpr int kSlotB = 1;
//                                                q  k  v  o  gate up down
constexpr std::array<int, kNumLoraTargets> kKAndV = {8, 4, 2, 6, 3, 5, 7};
constexpr std::array<int, kNumLoraTargets> kOnlyV = {4, 0, 6, 4, 0, 2, 0};
constexpr std::array<int, kNumLoraTargets> kNoKv = {4, 0, 0, 4, 2, 2, 2};

// Scattered block ids, more than any sequence here needs.
const std::vector<int32_t> kMainBlocks = {7, 2, 11, 5, 9, 0, 13, 4};
const std::vector<int32_t> kResidualBlocks = {3, 14, 1, 8, 12, 6, 10, 2};

struct Model {
  ModelConfig config;
  std::shared_ptr<ModelWeights> weights;
};

Model make_model(Architecture arch) {
  const ModelConfig config = test::tiny_config(arch);
  return {config, test::random_weights(config, 71)};
}

std::unique_ptr<Backend> new_backend(const Model& model, int block_size, int residual_block_size) {
  auto backend = make_cpu_backend(model.config, model.weights, {.num_threads = 0, .max_adapter_slots = 4});
  backend->allocate_kv_cache({32, block_size});
  backend->allocate_residual_cache({32, residual_block_size, kMaxRank});
  return backend;
}

// Runs tokens[0, prefill) as one step, then one token per step, as the
// sequence `shape` describes (slots, block ids, ...); the logits row of each step.
std::vector<std::vector<float>> run_steps(Backend& backend, SequenceInput shape, const std::vector<int32_t>& tokens,
                                          int prefill) {
  std::vector<std::vector<float>> rows;
  for (int done = 0; done < static_cast<int>(tokens.size());) {
    const int count = done == 0 ? prefill : 1;
    shape.tokens.assign(tokens.begin() + done, tokens.begin() + done + count);
    shape.num_computed_tokens = done;
    const ForwardResult result = backend.forward(make_batch({shape}));
    EXPECT_EQ(result.logits.size(), static_cast<size_t>(result.vocab_size));
    rows.push_back(result.logits);
    done += count;
  }
  return rows;
}

// rows[i] against reference[prefill - 1 + i].
void expect_rows_match(const std::vector<std::vector<float>>& rows, const ReferenceRun::Matrix& reference,
                       int prefill, const std::string& what) {
  for (size_t i = 0; i < rows.size(); ++i)
    EXPECT_LT(relative_diff(rows[i].data(), reference[prefill - 1 + i]), kTolerance) << what << " step " << i;
}

TEST(CpuBackendForked, AgentAloneEqualsIsolatedAdapter) {
  const int kPrefill = 19;  // >= 16: the chunked path; the decode steps take the short one
  for (Architecture arch : {Architecture::kLlama, Architecture::kQwen2}) {
    const Model model = make_model(arch);
    const auto tokens = test::random_tokens(72, kPrefill + 3, model.config.vocab_size);
    std::vector<int32_t> positions(tokens.size());
    for (size_t i = 0; i < positions.size(); ++i) positions[i] = static_cast<int32_t>(i);
    const auto base = test::reference_logits(model.config, *model.weights, tokens, positions,
                                             std::vector<const LoraAdapter*>(tokens.size(), nullptr));
    for (const auto& ranks : {kKAndV, kOnlyV, kNoKv}) {
      auto adapter = test::random_adapter(model.config, 73, ranks, 16.0f);
      const auto isolated = test::reference_logits(model.config, *model.weights, tokens, positions,
                                                   std::vector<const LoraAdapter*>(tokens.size(), adapter.get()));
      // The explicit reconstruction agrees with the isolated adapter (the split is exact for one agent).
      const ReferenceRun forked = test::reference_forked(model.config, *model.weights, tokens, *adapter);
      for (size_t t = 0; t < tokens.size(); ++t)
        for (size_t i = 0; i < isolated[t].size(); ++i) ASSERT_NEAR(forked.logits[t][i], isolated[t][i], 1e-9);
      // Residual paging independent of the main pool's.
      for (auto [block_size, residual_block_size] : {std::pair{4, 8}, std::pair{16, 4}}) {
        auto backend = new_backend(model, block_size, residual_block_size);
        backend->set_adapter(kSlotB, adapter);
        const SequenceInput shape{.adapter_slot = kSlotB, .block_ids = kMainBlocks, .forked_adapter_slot = kSlotB,
                                  .residual_block_ids = kResidualBlocks};
        const auto rows = run_steps(*backend, shape, tokens, kPrefill);
        const std::string what = fmt::format("{} ranks k{} v{} block {}", architecture_short_name(arch), ranks[1],
                                             ranks[2], block_size);
        expect_rows_match(rows, isolated, kPrefill, what);
        EXPECT_GT(test::max_abs_diff(rows.back().data(), base.back()), 1e-2) << what;  // the adapter matters
      }
    }
  }
}

TEST(CpuBackendForked, SecondAgentReadsTheFirstAgentsBaseCache) {
  const int kContext = 16;  // whole blocks of 4: agent B maps agent A's first four blocks
  for (Architecture arch : {Architecture::kLlama, Architecture::kQwen2}) {
    const Model model = make_model(arch);
    auto adapter_a = test::random_adapter(model.config, 74, kKAndV, 16.0f);
    auto adapter_b = test::random_adapter(model.config, 75, kKAndV, 16.0f);
    const auto context = test::random_tokens(76, kContext, model.config.vocab_size);
    std::vector<int32_t> tokens_b = context;
    for (int32_t token : test::random_tokens(77, 6, model.config.vocab_size)) tokens_b.push_back(token);

    auto backend = new_backend(model, 4, 8);
    backend->set_adapter(kSlotA, adapter_a);
    backend->set_adapter(kSlotB, adapter_b);
    const std::vector<int32_t> blocks_a = {7, 2, 11, 5, 13};
    backend->forward(make_batch({{.tokens = context, .adapter_slot = kSlotA, .block_ids = blocks_a,
                                  .forked_adapter_slot = kSlotA, .residual_block_ids = {3, 14, 10}}}));

    // B: the context's bCache is A's (present, read only); its own rCache and suffix are new.
    const SequenceInput shape_b{.adapter_slot = kSlotB, .block_ids = {7, 2, 11, 5, 9, 0},
                                .num_kv_present_tokens = kContext, .forked_adapter_slot = kSlotB,
                                .residual_block_ids = {1, 8, 12}};
    const auto rows_b = run_steps(*backend, shape_b, tokens_b, kContext + 4);

    const ReferenceRun run_a = test::reference_forked(model.config, *model.weights, context, *adapter_a);
    const ReferenceRun run_b =
        test::reference_forked(model.config, *model.weights, tokens_b, *adapter_b, &run_a, kContext);
    expect_rows_match(rows_b, run_b.logits, kContext + 4, architecture_short_name(arch));
    // Inheriting A's bCache is an approximation for B: it must show, or the test proves nothing.
    const ReferenceRun b_alone = test::reference_forked(model.config, *model.weights, tokens_b, *adapter_b);
    EXPECT_GT(test::max_abs_diff(rows_b.back().data(), b_alone.logits.back()), 1e-3);

    // A's entries survived B: A's next token still matches the isolated adapter.
    std::vector<int32_t> tokens_a = context;
    tokens_a.push_back(tokens_b[kContext]);
    const ForwardResult next = backend->forward(
        make_batch({{.tokens = {tokens_a.back()}, .adapter_slot = kSlotA, .num_computed_tokens = kContext,
                     .block_ids = blocks_a, .forked_adapter_slot = kSlotA, .residual_block_ids = {3, 14, 10}}}));
    const ReferenceRun a_next = test::reference_forked(model.config, *model.weights, tokens_a, *adapter_a);
    EXPECT_LT(relative_diff(next.logits.data(), a_next.logits.back()), kTolerance);
  }
}

// A sequence over blocks whose entries another sequence wrote, all marked
// present, leaves them bit for bit as they were; unmarked, it overwrites them.
TEST(CpuBackendForked, PresentEntriesAreNeverWritten) {
  const Model model = make_model(Architecture::kLlama);
  auto adapter = test::random_adapter(model.config, 78, kKAndV, 16.0f);
  const auto tokens = test::random_tokens(79, 8, model.config.vocab_size);
  const auto other_tokens = test::random_tokens(80, 8, model.config.vocab_size);
  for (bool forked : {false, true}) {
    const int32_t slot = forked ? kSlotA : -1;
    const SequenceInput writer{.tokens = tokens, .adapter_slot = slot, .block_ids = {3, 5, 6},
                               .forked_adapter_slot = slot, .residual_block_ids = {4, 6, 7}};
    SequenceInput next_token = writer;
    next_token.tokens = {17};
    next_token.num_computed_tokens = 8;

    auto logits_after = [&](const SequenceInput* intruder) {
      auto backend = new_backend(model, 4, 4);
      backend->set_adapter(kSlotA, adapter);
      backend->forward(make_batch({writer}));
      if (intruder != nullptr) backend->forward(make_batch({*intruder}));
      return backend->forward(make_batch({next_token})).logits;
    };
    const std::vector<float> undisturbed = logits_after(nullptr);

    SequenceInput intruder = writer;
    intruder.tokens = other_tokens;
    intruder.num_kv_present_tokens = 8;
    intruder.num_residual_present_tokens = forked ? 8 : 0;
    EXPECT_EQ(logits_after(&intruder), undisturbed) << "forked " << forked;

    // The same intruder with its main entries unmarked does overwrite them...
    intruder.num_kv_present_tokens = 3;
    EXPECT_NE(logits_after(&intruder), undisturbed) << "forked " << forked;
    if (!forked) continue;
    // ... and so does one with its residual entries unmarked.
    intruder.num_kv_present_tokens = 8;
    intruder.num_residual_present_tokens = 3;
    EXPECT_NE(logits_after(&intruder), undisturbed);
  }
}

// The bCache survived and the rCache did not, or the reverse: the request
// recomputes the context with the surviving part marked present and matches a full run.
TEST(CpuBackendForked, PartialHitsMatchAFullRun) {
  const int kContext = 16;
  for (Architecture arch : {Architecture::kLlama, Architecture::kQwen2}) {
    const Model model = make_model(arch);
    auto adapter = test::random_adapter(model.config, 81, kKAndV, 16.0f);
    const auto tokens = test::random_tokens(82, kContext + 4, model.config.vocab_size);
    const std::vector<int32_t> context(tokens.begin(), tokens.begin() + kContext);
    const ReferenceRun reference = test::reference_forked(model.config, *model.weights, tokens, *adapter);

    auto backend = new_backend(model, 4, 4);
    backend->set_adapter(kSlotA, adapter);
    const SequenceInput full{.tokens = tokens, .adapter_slot = kSlotA, .block_ids = {20, 21, 22, 23, 24},
                             .forked_adapter_slot = kSlotA, .residual_block_ids = {20, 21, 22, 23, 24}};
    const std::vector<float> expected = backend->forward(make_batch({full})).logits;
    EXPECT_LT(relative_diff(expected.data(), reference.logits.back()), kTolerance);

    // The context alone, first: main blocks 0-3, residual blocks 0-3.
    backend->forward(make_batch({{.tokens = context, .adapter_slot = kSlotA, .block_ids = {0, 1, 2, 3},
                                  .forked_adapter_slot = kSlotA, .residual_block_ids = {0, 1, 2, 3}}}));
    // bCache hit, rCache miss.
    const SequenceInput base_hit{.tokens = tokens, .adapter_slot = kSlotA, .block_ids = {0, 1, 2, 3, 4},
                                 .num_kv_present_tokens = kContext, .forked_adapter_slot = kSlotA,
                                 .residual_block_ids = {8, 9, 10, 11, 12}};
    const std::vector<float> after_base_hit = backend->forward(make_batch({base_hit})).logits;
    EXPECT_LT(relative_diff(after_base_hit.data(), reference.logits.back()), kTolerance);
    // rCache hit, bCache miss.
    const SequenceInput residual_hit{.tokens = tokens, .adapter_slot = kSlotA, .block_ids = {12, 13, 14, 15, 16},
                                     .forked_adapter_slot = kSlotA, .residual_block_ids = {0, 1, 2, 3, 13},
                                     .num_residual_present_tokens = kContext};
    const std::vector<float> after_residual_hit = backend->forward(make_batch({residual_hit})).logits;
    EXPECT_LT(relative_diff(after_residual_hit.data(), reference.logits.back()), kTolerance);
    // Same computation, other layout: equal up to summation order.
    for (size_t i = 0; i < expected.size(); ++i) {
      ASSERT_NEAR(after_base_hit[i], expected[i], 1e-4);
      ASSERT_NEAR(after_residual_hit[i], expected[i], 1e-4);
    }
  }
}

}  // namespace
}  // namespace loom
