// What the CUDA backend declares it runs (cuda_backend_capabilities), and the
// engine on the real CUDA backend refusing base / forked adapters when they
// are loaded (engine/backend_support.h) while the others serve one batch.
#include <gtest/gtest.h>

#include "backend/cuda/cuda_backend_impl.h"
#include "cuda_test_util.h"
#include "engine/engine.h"
#include "model/loader.h"
#include "synthetic/synthetic_model.h"
#include "test_util.h"

namespace loom::cuda {
namespace {

TEST(CudaCapabilities, DeclaresWhatForwardRuns) {  // no GPU needed
  const BackendCapabilities capabilities = cuda_backend_capabilities();
  EXPECT_EQ(capabilities.name, "cuda");
  EXPECT_EQ(capabilities.kv_sharing_modes, (std::vector<KvSharing>{KvSharing::kIsolated, KvSharing::kActivated}));
  EXPECT_EQ(capabilities.head_dims, (std::vector<int32_t>{16, 32, 64, 128}));
  EXPECT_EQ(capabilities.dimension_multiple, 8);
  EXPECT_EQ(capabilities.max_lora_rank, kLoraMaxRank);
  EXPECT_TRUE(capabilities.device_sampling);
  EXPECT_TRUE(capabilities.host_kv_tier);
  EXPECT_FALSE(capabilities.capture_hidden_states);
}

TEST(CudaCapabilities, EngineRefusesBaseAndForkedAdaptersAtLoad) {
  LOOM_REQUIRE_GPU();
  loom::test::TempDir directory;
  SyntheticModelOptions options;
  options.arch = Architecture::kLlama;
  options.num_adapters = 2;
  write_synthetic_model(directory.str(), options);
  LoadedModel model = load_model(directory.str());
  std::unique_ptr<Backend> backend = make_cuda_backend(model.config, *model.weights);
  EXPECT_TRUE(backend->supports_device_sampling());
  EngineConfig config;
  config.num_kv_blocks = 64;
  const std::string adapter = directory.str() + "/adapters/adapter1";

  EngineConfig base_default = config;
  base_default.default_sharing = KvSharing::kBase;
  loom::test::expect_error([&] { make_engine(model, make_cuda_backend(model.config, *model.weights), base_default); },
                           ErrorKind::kUnsupported,
                           {"--default-sharing: kv_sharing 'base' is not supported by the cuda backend"});

  std::unique_ptr<Engine> engine = make_engine(model, std::move(backend), config);
  loom::test::expect_error([&] { engine->load_adapter("critic", adapter, KvSharing::kBase); }, ErrorKind::kUnsupported,
                           {"adapter 'critic': kv_sharing 'base' is not supported by the cuda backend (supported: "
                            "isolated, activated)"});
  loom::test::expect_error([&] { engine->load_adapter("coder", adapter, KvSharing::kForked); },
                           ErrorKind::kUnsupported, {"kv_sharing 'forked' is not supported by the cuda backend"});
  engine->load_adapter("tester", adapter, KvSharing::kIsolated);

  std::vector<std::unique_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) {
    EngineRequest request;
    request.prompt_tokens = {10, 20, 30, 40 + i};
    request.max_new_tokens = 8;
    request.ignore_eos = true;
    request.adapter = i % 2 == 0 ? "" : "tester";
    streams.push_back(engine->submit(request));
  }
  for (auto& stream : streams) {
    int32_t num_tokens = 0;
    for (;;) {
      std::optional<RequestOutput> output = stream->next(std::chrono::seconds(60));
      ASSERT_TRUE(output.has_value());
      ASSERT_FALSE(output->error.has_value()) << output->error->what();
      num_tokens += static_cast<int32_t>(output->new_tokens.size());
      if (output->finished) break;
    }
    EXPECT_EQ(num_tokens, 8);
  }
  engine->shutdown(false);
}

}  // namespace
}  // namespace loom::cuda
