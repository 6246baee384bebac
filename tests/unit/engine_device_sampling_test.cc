// The engine's device-sampling path (backend.h DeviceSampling) on the CPU: a
// wrapper backend that claims device sampling and answers sampled rows with the
// argmax (greedy requests only here), returning logits for the other rows
// packed as the contract says. Greedy requests must give the Generator's
// tokens whichever path served each step; requests that need the host (top
// logprobs, min_new_tokens masking, penalties and logit_bias) must get their logits rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <span>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine_impl.h"
#include "grammar/constraint_compiler.h"
#include "engine_test_util.h"
#include "model/loader.h"
#include "oracles/generator.h"
#include "synthetic/synthetic_model.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"

namespace loom {
namespace {

class ArgmaxSamplingBackend final : public test::ForwardingBackend {
 public:
  ArgmaxSamplingBackend(std::unique_ptr<Backend> inner, bool token_masks = false, bool logit_processing = false)
      : ForwardingBackend(std::move(inner)), token_masks_(token_masks), logit_processing_(logit_processing) {}
  BackendCapabilities capabilities() const override {
    BackendCapabilities capabilities = inner().capabilities();
    capabilities.device_sampling = true;
    capabilities.host_cores_idle = true;  // as on a GPU: the host rows are sampled in parallel
    capabilities.device_token_masks = token_masks_;
    capabilities.device_logit_processing = logit_processing_;
    return capabilities;
  }

  ForwardResult forward(const Batch& batch) override {
    EXPECT_EQ(batch.num_token_mask_rows, 0) << "masks come through finish_forward";
    return run(batch, {});
  }
  void enqueue_forward(const Batch& batch) override { enqueued_ = &batch; }
  ForwardResult finish_forward(std::span<const uint32_t> token_masks) override {
    const Batch* batch = enqueued_;
    enqueued_ = nullptr;
    EXPECT_NE(batch, nullptr);
    return run(*batch, token_masks);
  }

  std::atomic<int64_t> num_device_rows{0}, num_host_rows{0}, num_masked_rows{0}, num_processed_rows{0};

 private:
  ForwardResult run(const Batch& batch, std::span<const uint32_t> masks) {
    Batch plain = batch;
    plain.sampling.clear();
    plain.num_token_mask_rows = 0;
    ForwardResult result = inner().forward(plain);
    if (batch.sampling.empty()) return result;
    EXPECT_EQ(batch.sampling.size(), batch.sequences.size());
    const size_t vocab = static_cast<size_t>(result.vocab_size);
    // As backend.h says: one row of ceil(vocab / 32) words per mask row, every row filled.
    const int32_t words_per_row = (result.vocab_size + 31) / 32;
    EXPECT_EQ(masks.size(), static_cast<size_t>(batch.num_token_mask_rows) * words_per_row);
    if (batch.num_token_mask_rows > 0) {
      EXPECT_TRUE(token_masks_);
    }
    std::vector<float> packed;
    for (size_t row = 0; row < batch.sequences.size(); ++row) {
      float* logits = result.logits.data() + row * vocab;
      if (batch.sampling[row].on_device && batch.sampling[row].mask_row >= 0) {
        ++num_masked_rows;
        const uint32_t* mask = masks.data() + static_cast<size_t>(batch.sampling[row].mask_row) * words_per_row;
        for (size_t t = 0; t < vocab; ++t)
          if (!((mask[t / 32] >> (t % 32)) & 1u)) logits[t] = -std::numeric_limits<float>::infinity();
      }
      // The logprob is under the row before processing (backend.h), so it is taken from a copy.
      std::vector<float> raw(logits, logits + vocab);
      const DeviceSampling& sampling = batch.sampling[row];
      if (sampling.on_device && sampling.num_edits > 0) {
        EXPECT_TRUE(logit_processing_);
        ++num_processed_rows;
        for (int32_t e = sampling.edits_begin; e < sampling.edits_begin + sampling.num_edits; ++e) {
          const LogitEdit& edit = batch.logit_edits[static_cast<size_t>(e)];
          float value = logits[edit.token] + edit.bias;
          if (edit.repeated) value = value > 0.0f ? value / sampling.repetition_penalty : value * sampling.repetition_penalty;
          logits[edit.token] = value - edit.subtract;
        }
      }
      if (!batch.sampling[row].on_device) {
        ++num_host_rows;
        packed.insert(packed.end(), logits, logits + vocab);
        result.sampled_token_ids.push_back(-1);
        result.sampled_logprobs.push_back(0.0f);
        continue;
      }
      ++num_device_rows;
      EXPECT_EQ(batch.sampling[row].temperature, 0.0f);
      const auto best = static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
      const float max_raw = *std::max_element(raw.begin(), raw.end());
      double sum = 0.0;
      for (size_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(raw[i] - max_raw));
      result.sampled_token_ids.push_back(best);
      result.sampled_logprobs.push_back(static_cast<float>(raw[static_cast<size_t>(best)] - max_raw - std::log(sum)));
    }
    result.logits = std::move(packed);
    return result;
  }

  const Batch* enqueued_ = nullptr;
  bool token_masks_, logit_processing_;
};

// A synthetic llama written to a temporary directory and loaded (the files can go once loaded).
LoadedModel load_llama_model() {
  test::TempDir directory;
  SyntheticModelOptions options;
  options.arch = Architecture::kLlama;
  write_synthetic_model(directory.str(), options);
  return load_model(directory.str());
}

// The tests' engine: small blocks and steps over `backend`.
std::unique_ptr<EngineImpl> make_engine(const LoadedModel& model, std::unique_ptr<Backend> backend) {
  EngineConfig config;
  config.block_size = 4;
  config.num_kv_blocks = 256;
  config.max_batch_tokens = 32;
  return std::make_unique<EngineImpl>(model, std::move(backend), config);
}

std::vector<int32_t> tokens_of(RequestStream& stream) {
  std::vector<int32_t> tokens;
  test::read_stream(stream, [&](const RequestOutput& output) {
    EXPECT_FALSE(output.error.has_value());
    for (const auto& token : output.new_tokens) tokens.push_back(token.token_id);
  });
  return tokens;
}

TEST(EngineDeviceSampling, DeviceAndHostRowsMixInOneBatchAndMatchTheGenerator) {
  const LoadedModel model = load_llama_model();
  auto owned = std::make_unique<ArgmaxSamplingBackend>(make_cpu_backend(model.config, model.weights, {1, 8}));
  ArgmaxSamplingBackend* backend = owned.get();
  auto engine = make_engine(model, std::move(owned));

  std::vector<EngineRequest> requests;
  for (int i = 0; i < 6; ++i) {
    EngineRequest request;
    request.prompt_tokens = model.tokenizer->encode("device sampling request " + std::to_string(i), true);
    request.max_new_tokens = 7;
    request.ignore_eos = true;
    requests.push_back(request);
  }
  requests[1].sampling.num_top_logprobs = 2;  // host only
  requests[2].min_new_tokens = 3;             // host for its first three tokens
  requests[2].stop_token_ids = {5};
  requests[3].sampling.presence_penalty = 1.0f;  // host only: the device sampler has no penalties or bias
  requests[3].sampling.repetition_penalty = 1.2f;
  requests[3].sampling.logit_bias = {{7, 2.0f}};
  std::vector<std::vector<int32_t>> results(requests.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < requests.size(); ++i)
    clients.emplace_back([&, i] { results[i] = tokens_of(*engine->submit(requests[i])); });
  for (auto& client : clients) client.join();
  engine->shutdown(false);

  for (size_t i = 0; i < requests.size(); ++i) {
    if (i == 2) continue;  // stop token 5 may end it early on either path
    auto reference_backend = make_cpu_backend(model.config, model.weights, {1, 8});
    GenerationRequest generation;
    generation.prompt_tokens = requests[i].prompt_tokens;
    generation.max_new_tokens = requests[i].max_new_tokens;
    generation.ignore_eos = true;
    generation.sampling = requests[i].sampling;
    Generator generator(*reference_backend, model.tokenizer, {});
    std::vector<int32_t> expected;
    const std::vector<GenerationResult> generated = generator.generate({generation});
    for (const auto& token : generated[0].tokens) expected.push_back(token.token_id);
    EXPECT_EQ(results[i], expected) << "request " << i;
  }
  EXPECT_GT(backend->num_device_rows.load(), 0);
  EXPECT_GE(backend->num_host_rows.load(), 7 + 3 + 7) << "requests 1 and 3's rows and request 2's first three";
}

// Structured outputs drawn on the device (capabilities().device_token_masks):
// each constrained row gets a mask row the engine fills from the grammar, and
// greedy requests give what the host path (masks applied to logits rows on the
// host) gives, ending where the grammar ends.
TEST(EngineDeviceSampling, ConstrainedRowsDrawnOnTheDeviceMatchTheHostPath) {
  const LoadedModel model = load_llama_model();
  grammar::ConstraintCompiler compiler(grammar::TokenVocabulary::from_tokenizer(*model.tokenizer));
  const std::vector<std::shared_ptr<const grammar::CompiledGrammar>> constraints = {
      compiler.regex("[a-e]{2,6}-(yes|no)"), compiler.choice({"alpha", "beta", "gamma delta"}),
      compiler.json_schema(nlohmann::json::parse(
          R"({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": false})"))};

  auto run = [&](bool token_masks, int64_t* masked_rows) {
    auto owned = std::make_unique<ArgmaxSamplingBackend>(make_cpu_backend(model.config, model.weights, {1, 8}), token_masks);
    ArgmaxSamplingBackend* backend = owned.get();
    auto engine = make_engine(model, std::move(owned));
    std::vector<EngineRequest> requests;
    for (size_t i = 0; i < constraints.size() + 1; ++i) {
      EngineRequest request;
      request.prompt_tokens = model.tokenizer->encode("constrained request " + std::to_string(i), true);
      request.max_new_tokens = 24;
      if (i < constraints.size()) request.constraint = constraints[i];  // the last one is free
      requests.push_back(request);
    }
    std::vector<std::vector<int32_t>> tokens(requests.size());
    std::vector<std::string> text(requests.size());
    std::vector<std::thread> clients;
    for (size_t i = 0; i < requests.size(); ++i)
      clients.emplace_back([&, i] {
        test::read_stream(*engine->submit(requests[i]), [&](const RequestOutput& output) {
          EXPECT_FALSE(output.error.has_value()) << output.error->what();
          text[i] += output.text_delta;
          for (const auto& token : output.new_tokens) tokens[i].push_back(token.token_id);
        });
      });
    for (auto& client : clients) client.join();
    engine->shutdown(false);
    *masked_rows = backend->num_masked_rows.load();
    return std::make_pair(tokens, text);
  };
  int64_t device_masked = 0, host_masked = 0;
  const auto [device_tokens, device_text] = run(true, &device_masked);
  const auto [host_tokens, host_text] = run(false, &host_masked);
  EXPECT_EQ(device_tokens, host_tokens);
  EXPECT_EQ(device_text, host_text);
  EXPECT_GT(device_masked, 0);
  EXPECT_EQ(host_masked, 0);
  for (size_t i = 0; i < constraints.size(); ++i) EXPECT_FALSE(device_tokens[i].empty()) << "request " << i;
  std::printf("[ device masks ] %lld masked device rows; outputs: '%s' '%s' '%s'\n",
              static_cast<long long>(device_masked), device_text[0].c_str(), device_text[1].c_str(),
              device_text[2].c_str());
}

// Penalties and logit_bias processed by the backend (device_logit_processing):
// greedy requests give the host path's tokens and raw logprobs, and the
// penalties see the tokens drawn on the device.
TEST(EngineDeviceSampling, PenaltiesAndBiasProcessedOnTheDeviceMatchTheHostPath) {
  const LoadedModel model = load_llama_model();
  auto run = [&](bool processing, int64_t* processed_rows) {
    auto owned = std::make_unique<ArgmaxSamplingBackend>(make_cpu_backend(model.config, model.weights, {1, 8}), false,
                                                         processing);
    ArgmaxSamplingBackend* backend = owned.get();
    auto engine = make_engine(model, std::move(owned));
    std::vector<EngineRequest> requests(4);
    for (size_t i = 0; i < requests.size(); ++i) {
      requests[i].prompt_tokens = model.tokenizer->encode("penalised request " + std::to_string(i), true);
      requests[i].max_new_tokens = 24;
      requests[i].ignore_eos = true;
    }
    requests[0].sampling.presence_penalty = 1.5f;
    requests[0].sampling.frequency_penalty = 0.7f;
    requests[1].sampling.repetition_penalty = 1.4f;
    requests[2].sampling.logit_bias = {{7, 3.0f}, {11, -2.0f}};
    requests[2].sampling.frequency_penalty = 0.3f;
    std::vector<std::vector<std::pair<int32_t, float>>> tokens(requests.size());
    std::vector<std::thread> clients;
    for (size_t i = 0; i < requests.size(); ++i)
      clients.emplace_back([&, i] {
        test::read_stream(*engine->submit(requests[i]), [&](const RequestOutput& output) {
          EXPECT_FALSE(output.error.has_value());
          for (const auto& token : output.new_tokens) tokens[i].emplace_back(token.token_id, token.logprob);
        });
      });
    for (auto& client : clients) client.join();
    engine->shutdown(false);
    *processed_rows = backend->num_processed_rows.load();
    return tokens;
  };
  int64_t device_processed = 0, host_processed = 0;
  const auto device = run(true, &device_processed);
  const auto host = run(false, &host_processed);
  ASSERT_EQ(device.size(), host.size());
  for (size_t i = 0; i < device.size(); ++i) {
    ASSERT_EQ(device[i].size(), host[i].size()) << "request " << i;
    for (size_t t = 0; t < device[i].size(); ++t) {
      EXPECT_EQ(device[i][t].first, host[i][t].first) << "request " << i << " token " << t;
      EXPECT_NEAR(device[i][t].second, host[i][t].second, 1e-4) << "request " << i << " token " << t;
    }
  }
  EXPECT_GE(device_processed, 3 * 23) << "requests 0-2 from their second token (the first has no output to penalise "
                                         "except request 2's bias)";
  EXPECT_EQ(host_processed, 0);
}

}  // namespace
}  // namespace loom
