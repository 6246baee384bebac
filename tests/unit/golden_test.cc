// Loom's CPU forward pass against transformers + PEFT (fp32), for every
// architecture and a variety of adapters (all modules, some modules, rsLoRA +
// rank/alpha patterns, regex targets, activated LoRA). The models are
// regenerated here by `make-model`'s code (byte-identical to the ones the
// goldens were computed on; synthetic_model_test checks the checksums).
// Fixtures: tools/golden/make_fixtures.sh.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "formats/safetensors.h"
#include "lora/adapter.h"
#include "model/loader.h"
#include "oracles/generator.h"
#include "synthetic/synthetic_model.h"
#include "test_util.h"

namespace loom {
namespace {

constexpr float kLogitTolerance = 1e-3f;

struct GoldenCase {
  const char* name;
  Architecture arch;
  int num_adapters;
  bool alora;
};

std::vector<int32_t> row_ids(const Tensor& tensor, int64_t row) {
  const int64_t width = tensor.shape.back();
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < width; ++i) ids.push_back(static_cast<int32_t>(tensor.data[row * width + i]));
  return ids;
}

// First position of the last occurrence of `pattern` in `tokens`, or -1 (PEFT's rule).
int32_t last_occurrence(const std::vector<int32_t>& tokens, const std::vector<int>& pattern) {
  if (pattern.empty() || pattern.size() > tokens.size()) return -1;
  for (int64_t start = static_cast<int64_t>(tokens.size() - pattern.size()); start >= 0; --start) {
    bool match = true;
    for (size_t j = 0; j < pattern.size() && match; ++j) match = tokens[static_cast<size_t>(start) + j] == pattern[j];
    if (match) return static_cast<int32_t>(start);
  }
  return -1;
}

class GoldenTest : public ::testing::TestWithParam<GoldenCase> {
 protected:
  void SetUp() override {
    const GoldenCase& golden_case = GetParam();
    SyntheticModelOptions options;
    options.arch = golden_case.arch;
    options.num_adapters = golden_case.num_adapters;
    options.alora_invocation = golden_case.alora;
    write_synthetic_model(directory_.str(), options);
    model_ = load_model(directory_.str());
    golden_ = read_safetensors(test::fixture_path(fmt::format("golden/{}.safetensors", golden_case.name)));
    backend_ = make_cpu_backend(model_.config, model_.weights);
    variants_.push_back({"base", -1, {}});
    for (int i = 0; i < golden_case.num_adapters; ++i) {
      const std::string name = fmt::format("adapter{}", i);
      auto adapter = load_lora_adapter(name, fmt::format("{}/adapters/{}", directory_.str(), name), model_.config);
      backend_->set_adapter(i, adapter);
      variants_.push_back({name, i, adapter->config.alora_invocation_tokens});
    }
  }

  struct Variant {
    std::string name;
    int32_t slot;
    std::vector<int> alora_invocation;  // empty: the adapter applies to every token
  };

  // The slot each prompt token runs with: activated adapters start at the invocation.
  static std::vector<int32_t> token_slots(const Variant& variant, const std::vector<int32_t>& prompt) {
    std::vector<int32_t> slots(prompt.size(), variant.slot);
    if (!variant.alora_invocation.empty()) {
      const int32_t start = last_occurrence(prompt, variant.alora_invocation);
      for (size_t i = 0; i < prompt.size(); ++i)
        if (start < 0 || static_cast<int32_t>(i) < start) slots[i] = -1;
    }
    return slots;
  }

  test::TempDir directory_;
  LoadedModel model_;
  TensorMap golden_;
  std::unique_ptr<Backend> backend_;
  std::vector<Variant> variants_;
};

// Every (variant, prompt) pair runs as one sequence of ONE batch that mixes
// the base model and all adapters; each row must match its own golden.
TEST_P(GoldenTest, PerPositionLogitsMatchTransformersInOneMixedBatch) {
  const Tensor& prompts = golden_.at("prompts");
  const int64_t num_prompts = prompts.shape[0];
  const int64_t prompt_length = prompts.shape[1];
  const int32_t blocks_per_sequence = static_cast<int32_t>((prompt_length + 3) / 4);
  backend_->allocate_kv_cache({static_cast<int32_t>(variants_.size() * num_prompts) * blocks_per_sequence, 4});

  Batch batch;
  for (const Variant& variant : variants_) {
    for (int64_t p = 0; p < num_prompts; ++p) {
      const std::vector<int32_t> prompt = row_ids(prompts, p);
      const std::vector<int32_t> slots = token_slots(variant, prompt);
      BatchSequence sequence;
      sequence.num_new_tokens = static_cast<int32_t>(prompt.size());
      sequence.token_offset = batch.num_tokens();
      sequence.block_table_offset = static_cast<int32_t>(batch.block_tables.size());
      sequence.num_blocks = blocks_per_sequence;
      sequence.logits_for_all_tokens = true;
      for (size_t i = 0; i < prompt.size(); ++i) {
        batch.token_ids.push_back(prompt[i]);
        batch.positions.push_back(static_cast<int32_t>(i));
        batch.adapter_slots.push_back(slots[i]);
      }
      // Blocks handed out in reverse so that no sequence gets contiguous ids.
      for (int32_t b = 0; b < blocks_per_sequence; ++b)
        batch.block_tables.push_back(static_cast<int32_t>(batch.sequences.size()) + b * static_cast<int32_t>(variants_.size() * num_prompts));
      batch.sequences.push_back(sequence);
    }
  }
  ForwardResult result = backend_->forward(batch);
  ASSERT_EQ(result.logit_token_index.size(), batch.token_ids.size());

  const int64_t vocab = result.vocab_size;
  size_t row = 0;
  for (const Variant& variant : variants_) {
    const Tensor& expected = golden_.at(variant.name + ".logits");
    ASSERT_EQ(expected.shape, (std::vector<int64_t>{num_prompts, prompt_length, vocab}));
    float max_diff = 0.0f;
    for (int64_t p = 0; p < num_prompts; ++p) {
      for (int64_t t = 0; t < prompt_length; ++t, ++row) {
        const float* loom_row = result.logits.data() + row * static_cast<size_t>(vocab);
        const float* golden_row = expected.data + (p * prompt_length + t) * vocab;
        for (int64_t v = 0; v < vocab; ++v) max_diff = std::max(max_diff, std::fabs(loom_row[v] - golden_row[v]));
      }
    }
    EXPECT_LT(max_diff, kLogitTolerance) << variant.name;
    std::printf("%s %s: max |logit - transformers| = %.3g\n", GetParam().name, variant.name.c_str(), max_diff);
  }
}

// 32 greedy tokens per (variant, prompt), all generated in one batch. A step
// whose recorded top-1/top-2 gap is within the logit tolerance is a near-tie:
// the comparison stops there (both answers are right to fp32 accuracy).
TEST_P(GoldenTest, GreedyTokensMatchTransformers) {
  const Tensor& prompts = golden_.at("prompts");
  std::vector<GenerationRequest> requests;
  std::vector<const Variant*> request_variants;
  std::vector<int64_t> request_prompts;
  for (const Variant& variant : variants_) {
    if (!variant.alora_invocation.empty()) continue;  // activated generation: issue "Share KV"
    for (int64_t p = 0; p < prompts.shape[0]; ++p) {
      GenerationRequest request;
      request.prompt_tokens = row_ids(prompts, p);
      request.adapter_slot = variant.slot;
      request.max_new_tokens = static_cast<int32_t>(golden_.at(variant.name + ".greedy").shape[1]);
      request.ignore_eos = true;
      requests.push_back(request);
      request_variants.push_back(&variant);
      request_prompts.push_back(p);
    }
  }
  Generator generator(*backend_, model_.tokenizer, GeneratorConfig{});
  const auto results = generator.generate(requests);
  int num_compared = 0;
  for (size_t r = 0; r < results.size(); ++r) {
    const std::string& name = request_variants[r]->name;
    const std::vector<int32_t> expected = row_ids(golden_.at(name + ".greedy"), request_prompts[r]);
    const Tensor& margins = golden_.at(name + ".greedy_margin");
    for (size_t step = 0; step < expected.size(); ++step) {
      ASSERT_EQ(results[r].tokens[step].token_id, expected[step]) << name << " prompt " << request_prompts[r]
                                                                  << " step " << step;
      ++num_compared;
      if (margins.data[request_prompts[r] * margins.shape[1] + static_cast<int64_t>(step)] < 2 * kLogitTolerance) break;
    }
  }
  // Near-ties are rare: most steps must have been compared.
  EXPECT_GE(num_compared, static_cast<int>(requests.size()) * 32 / 2);
  std::printf("%s: %d of %zu greedy steps compared\n", GetParam().name, num_compared, requests.size() * 32);
}

INSTANTIATE_TEST_SUITE_P(Architectures, GoldenTest,
                         ::testing::Values(GoldenCase{"llama", Architecture::kLlama, 4, false},
                                           GoldenCase{"qwen2", Architecture::kQwen2, 4, false},
                                           GoldenCase{"qwen3", Architecture::kQwen3, 4, false},
                                           GoldenCase{"mistral", Architecture::kMistral, 4, false},
                                           GoldenCase{"llama_alora", Architecture::kLlama, 2, true}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace loom
