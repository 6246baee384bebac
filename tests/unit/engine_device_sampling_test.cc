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
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine_impl.h"
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
  using ForwardingBackend::ForwardingBackend;
  BackendCapabilities capabilities() const override {
    BackendCapabilities capabilities = inner().capabilities();
    capabilities.device_sampling = true;
    return capabilities;
  }

  ForwardResult forward(const Batch& batch) override {
    Batch plain = batch;
    plain.sampling.clear();
    ForwardResult result = inner().forward(plain);
    if (batch.sampling.empty()) return result;
    EXPECT_EQ(batch.sampling.size(), batch.sequences.size());
    const size_t vocab = static_cast<size_t>(result.vocab_size);
    std::vector<float> packed;
    for (size_t row = 0; row < batch.sequences.size(); ++row) {
      const float* logits = result.logits.data() + row * vocab;
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
      double sum = 0.0;
      for (size_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(logits[i] - logits[best]));
      result.sampled_token_ids.push_back(best);
      result.sampled_logprobs.push_back(static_cast<float>(-std::log(sum)));
    }
    result.logits = std::move(packed);
    return result;
  }

  std::atomic<int64_t> num_device_rows{0}, num_host_rows{0};
};

std::vector<int32_t> tokens_of(RequestStream& stream) {
  std::vector<int32_t> tokens;
  test::read_stream(stream, [&](const RequestOutput& output) {
    EXPECT_FALSE(output.error.has_value());
    for (const auto& token : output.new_tokens) tokens.push_back(token.token_id);
  });
  return tokens;
}

TEST(EngineDeviceSampling, DeviceAndHostRowsMixInOneBatchAndMatchTheGenerator) {
  test::TempDir directory;
  SyntheticModelOptions options;
  options.arch = Architecture::kLlama;
  write_synthetic_model(directory.str(), options);
  const LoadedModel model = load_model(directory.str());
  auto owned = std::make_unique<ArgmaxSamplingBackend>(make_cpu_backend(model.config, model.weights, {1, 8}));
  ArgmaxSamplingBackend* backend = owned.get();
  EngineConfig config;
  config.block_size = 4;
  config.num_kv_blocks = 256;
  config.max_batch_tokens = 32;
  auto engine = std::make_unique<EngineImpl>(model, std::move(owned), config);

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

}  // namespace
}  // namespace loom
