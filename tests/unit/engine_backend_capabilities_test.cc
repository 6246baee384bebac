// Backend capabilities (backend_capabilities.h) and the engine's up-front
// checks (engine/backend_support.h): a CPU backend wrapped to declare less
// (isolated and activated only, no host tier; its forward() refuses
// base/forked sequences, as a backend without those kernels would) must
// refuse base / forked adapters when they are loaded, with the message naming
// what is missing, and keep serving everything else; the operator's
// disabled modes (EngineConfig::disabled_kv_sharing, --disable-kv-sharing)
// refuse the same way on the CPU backend.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "engine/backend_support.h"
#include "engine/engine_impl.h"
#include "engine_test_util.h"
#include "lora/adapter.h"
#include "model/loader.h"
#include "synthetic/synthetic_model.h"
#include "test_util.h"

namespace loom {
namespace {

using test::CommandResult;

// Forwards to a CPU backend but declares `capabilities`; forward() refuses
// base / forked sequences (as the CUDA backend does) and counts the refusals.
class LimitedBackend final : public test::ForwardingBackend {
 public:
  LimitedBackend(std::unique_ptr<Backend> inner, BackendCapabilities capabilities)
      : ForwardingBackend(std::move(inner)), capabilities_(std::move(capabilities)) {}
  BackendCapabilities capabilities() const override { return capabilities_; }
  ForwardResult forward(const Batch& batch) override {
    for (const BatchSequence& sequence : batch.sequences)
      if (sequence.decoder_adapter_slot >= 0 || sequence.forked_adapter_slot >= 0) {
        ++num_refused_batches;
        throw Error(ErrorKind::kUnsupported, "limited backend: a base or forked sequence in the batch");
      }
    ++num_forward_calls;
    return ForwardingBackend::forward(batch);
  }

  std::atomic<int32_t> num_forward_calls{0}, num_refused_batches{0};

 private:
  BackendCapabilities capabilities_;
};

// A backend with the interleaved-sharing kernels only (isolated and activated).
BackendCapabilities cuda_like_capabilities() {
  BackendCapabilities capabilities;
  capabilities.name = "limited";
  capabilities.kv_sharing_modes = {KvSharing::kIsolated, KvSharing::kActivated};
  return capabilities;
}

struct Collected {
  std::vector<int32_t> tokens;
  std::optional<Error> error;
};

Collected collect(RequestStream& stream) {
  Collected result;
  test::read_stream(stream, [&](const RequestOutput& output) {
    for (const auto& token : output.new_tokens) result.tokens.push_back(token.token_id);
    result.error = output.error;
  });
  return result;
}

class EngineBackendCapabilitiesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = new test::TempDir();
    // Llama (the default): no q/k norm, so forked is possible on the CPU; every adapter may be served activated.
    model_ = new LoadedModel(
        test::write_and_load_synthetic_model(*directory_, 3, /*alora_invocation=*/true));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete directory_;
  }
  static std::string adapter_path(int i) { return directory_->str() + "/adapters/adapter" + std::to_string(i); }

  static EngineConfig small_config() { return test::small_sharing_engine_config(); }
  static std::unique_ptr<Backend> cpu_backend() { return make_cpu_backend(model_->config, model_->weights, {1, 8}); }
  // An engine on the limited backend (kept in backend_ for its counters).
  std::unique_ptr<EngineImpl> make_limited(EngineConfig config = small_config(),
                                           BackendCapabilities capabilities = cuda_like_capabilities()) {
    auto backend = std::make_unique<LimitedBackend>(cpu_backend(), std::move(capabilities));
    backend_ = backend.get();
    return std::make_unique<EngineImpl>(*model_, std::move(backend), config);
  }
  static EngineRequest request(int32_t seed, int32_t max_new_tokens, const std::string& adapter = "") {
    EngineRequest request;
    for (int32_t i = 0; i < 10; ++i) request.prompt_tokens.push_back(10 + (i * 37 + seed * 101) % 240);
    request.max_new_tokens = max_new_tokens;
    request.adapter = adapter;
    request.ignore_eos = true;
    return request;
  }
  std::vector<std::string> adapter_names(const Engine& engine) {
    std::vector<std::string> names;
    for (const AdapterInfo& info : engine.adapters()) names.push_back(info.name);
    return names;
  }

  static test::TempDir* directory_;
  static LoadedModel* model_;
  LimitedBackend* backend_ = nullptr;
};
test::TempDir* EngineBackendCapabilitiesTest::directory_ = nullptr;
LoadedModel* EngineBackendCapabilitiesTest::model_ = nullptr;

TEST(BackendSupport, AllowedModesAreTheBackendsLessTheDisabledOnes) {
  BackendCapabilities cpu_like;
  cpu_like.name = "cpu";
  cpu_like.kv_sharing_modes = all_kv_sharing_modes();
  EXPECT_EQ(allowed_kv_sharing(cpu_like, {}), all_kv_sharing_modes());
  EXPECT_EQ(allowed_kv_sharing(cpu_like, {KvSharing::kBase}),
            (std::vector<KvSharing>{KvSharing::kIsolated, KvSharing::kActivated, KvSharing::kForked}));
  EXPECT_EQ(allowed_kv_sharing(cuda_like_capabilities(), {KvSharing::kActivated, KvSharing::kForked}),
            std::vector<KvSharing>{KvSharing::kIsolated});
  EXPECT_EQ(kv_sharing_list({KvSharing::kForked, KvSharing::kIsolated}), "isolated, forked");
  EXPECT_EQ(kv_sharing_list({}), "none");

  // Who refused is named: the backend first, then the operator.
  test::expect_error([&] { check_kv_sharing_allowed(cuda_like_capabilities(), {KvSharing::kBase}, KvSharing::kBase, "x", ""); },
                     ErrorKind::kUnsupported, {"x: kv_sharing 'base' is not supported by the limited backend"});
  test::expect_error([&] { check_kv_sharing_allowed(cpu_like, {KvSharing::kBase}, KvSharing::kBase, "x", ""); },
                     ErrorKind::kUnsupported,
                     {"x: kv_sharing 'base' is disabled on this server by --disable-kv-sharing (allowed: isolated, "
                      "activated, forked)"});
  check_kv_sharing_allowed(cpu_like, {KvSharing::kBase}, KvSharing::kForked, "x", "");  // allowed: no throw
}

TEST(BackendSupport, ModelsTheBackendCannotRunAreNamed) {
  ModelConfig model = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);  // head_dim 16
  BackendCapabilities capabilities = cuda_like_capabilities();
  check_model_capabilities(capabilities, model);  // any head dim, any multiple
  capabilities.head_dims = {64, 128};
  test::expect_error([&] { check_model_capabilities(capabilities, model); }, ErrorKind::kUnsupported,
                     {"head_dim 16 is not supported by the limited backend (supported: 64, 128)", "--device cpu"});
  capabilities.head_dims = {16};
  check_model_capabilities(capabilities, model);
  capabilities.dimension_multiple = 48;  // hidden 64
  test::expect_error([&] { check_model_capabilities(capabilities, model); }, ErrorKind::kUnsupported,
                     {"multiples of 48", "limited backend"});
}

TEST_F(EngineBackendCapabilitiesTest, BaseAndForkedAdaptersAreRefusedAtLoadAndTheRestIsServed) {
  EngineConfig config = small_config();
  config.max_adapter_slots = 2;  // a refused load must not keep a slot
  auto engine = make_limited(config);
  test::expect_error([&] { engine->load_adapter("critic", adapter_path(1), KvSharing::kBase); },
                     ErrorKind::kUnsupported,
                     {"adapter 'critic': kv_sharing 'base' is not supported by the limited backend (supported: "
                      "isolated, activated)",
                      "load it with kv_sharing isolated or activated", "--lora critic=PATH:isolated", "--device cpu"});
  test::expect_error([&] { engine->load_adapter("coder", adapter_path(2), KvSharing::kForked); },
                     ErrorKind::kUnsupported,
                     {"adapter 'coder': kv_sharing 'forked' is not supported by the limited backend"});
  EXPECT_TRUE(adapter_names(*engine).empty());

  engine->load_adapter("planner", adapter_path(0), KvSharing::kActivated);
  engine->load_adapter("tester", adapter_path(1), KvSharing::kIsolated);
  EXPECT_EQ(adapter_names(*engine), (std::vector<std::string>{"planner", "tester"}));

  // Base model and both adapters in one batch: nothing the backend refuses reaches forward().
  std::vector<EngineRequest> requests = {request(1, 6), request(2, 6, "planner"), request(3, 6, "tester"),
                                         request(4, 6, "tester")};
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (const EngineRequest& r : requests) streams.push_back(engine->submit(r));
  std::vector<Collected> results;
  for (auto& stream : streams) results.push_back(collect(*stream));
  engine->shutdown(false);
  EXPECT_EQ(backend_->num_refused_batches.load(), 0);
  EXPECT_GT(backend_->num_forward_calls.load(), 0);

  // The same tokens as each request alone on the plain CPU backend.
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_FALSE(results[i].error.has_value()) << results[i].error->what();
    auto reference = std::make_unique<EngineImpl>(*model_, cpu_backend(), small_config());
    if (requests[i].adapter == "planner") reference->load_adapter("planner", adapter_path(0), KvSharing::kActivated);
    if (requests[i].adapter == "tester") reference->load_adapter("tester", adapter_path(1), KvSharing::kIsolated);
    const Collected alone = collect(*reference->submit(requests[i]));
    reference->shutdown(false);
    EXPECT_EQ(results[i].tokens, alone.tokens) << "request " << i;
  }
}

TEST_F(EngineBackendCapabilitiesTest, TheAdaptersOwnChoiceAndTheDefaultAreCheckedToo) {
  // adapter_config.json "loom_kv_sharing": "base", no mode asked for.
  test::TempDir copy;
  std::filesystem::copy(adapter_path(1), copy.path() / "critic", std::filesystem::copy_options::recursive);
  const std::filesystem::path config_path = copy.path() / "critic" / "adapter_config.json";
  nlohmann::json adapter_config = nlohmann::json::parse(test::read_file_bytes(config_path));
  adapter_config["loom_kv_sharing"] = "base";
  std::ofstream(config_path) << adapter_config.dump();

  auto engine = make_limited();
  test::expect_error([&] { engine->load_adapter("critic", (copy.path() / "critic").string()); },
                     ErrorKind::kUnsupported, {"adapter 'critic': kv_sharing 'base' is not supported"});
  engine->load_adapter("critic", (copy.path() / "critic").string(), KvSharing::kIsolated);  // overridden: fine
  engine->shutdown(false);

  for (KvSharing mode : {KvSharing::kBase, KvSharing::kForked}) {
    EngineConfig config = small_config();
    config.default_sharing = mode;
    test::expect_error([&] { make_limited(config); }, ErrorKind::kUnsupported,
                       {std::string("--default-sharing: kv_sharing '") + kv_sharing_name(mode) +
                            "' is not supported by the limited backend",
                        "set --default-sharing to isolated or activated"});
  }
}

TEST_F(EngineBackendCapabilitiesTest, ForkedAdaptersAboveTheResidualRankAreRefusedAtLoad) {
  BackendCapabilities capabilities = cuda_like_capabilities();
  capabilities.kv_sharing_modes = all_kv_sharing_modes();
  capabilities.max_residual_rank = 4;  // the synthetic adapters have rank 8
  auto engine = make_limited(small_config(), capabilities);
  test::expect_error([&] { engine->load_adapter("planner", adapter_path(0), KvSharing::kForked); },
                     ErrorKind::kUnsupported,
                     {"adapter 'planner': forked sharing with k/v LoRA rank 8; the limited backend's "
                      "ResidualAttention runs up to 4",
                      "load it with kv_sharing isolated or base"});
  EXPECT_TRUE(adapter_names(*engine).empty());
  engine->load_adapter("planner", adapter_path(0), KvSharing::kIsolated);  // other modes are not limited by it
  EXPECT_EQ(adapter_names(*engine), (std::vector<std::string>{"planner"}));
  engine->shutdown(false);
}

TEST_F(EngineBackendCapabilitiesTest, EngineConfigTheBackendCannotRunFailsAtConstruction) {
  EngineConfig host_tier = small_config();
  host_tier.num_host_kv_blocks = 16;
  test::expect_error([&] { make_limited(host_tier); }, ErrorKind::kUnsupported,
                     {"host KV tier", "not supported by the limited backend"});
  // A host tier for the main pool only (as the CUDA backend has it): an rCache host tier asked for is refused.
  BackendCapabilities main_host_tier = cuda_like_capabilities();
  main_host_tier.host_kv_tier = true;
  EngineConfig residual_host_tier = small_config();
  residual_host_tier.host_kv_cache_bytes = 1 << 20;
  residual_host_tier.host_residual_kv_cache_bytes = 1 << 16;
  test::expect_error([&] { make_limited(residual_host_tier, main_host_tier); }, ErrorKind::kUnsupported,
                     {"host tier for the forked rCache (--host-residual-kv-memory) is not supported by the limited "
                      "backend",
                      "--host-residual-kv-memory auto or 0"});
  EngineConfig residual = small_config();
  residual.residual_kv_cache_bytes = 1 << 20;
  test::expect_error([&] { make_limited(residual); }, ErrorKind::kUnsupported,
                     {"--residual-kv-cache-memory", "kv_sharing 'forked' is not supported"});
  BackendCapabilities head_dims = cuda_like_capabilities();
  head_dims.head_dims = {128};
  test::expect_error([&] { make_limited(small_config(), head_dims); }, ErrorKind::kUnsupported,
                     {"head_dim 16 is not supported by the limited backend (supported: 128)"});
}

TEST_F(EngineBackendCapabilitiesTest, RanksAboveTheBackendsLargestAreRefused) {
  BackendCapabilities capabilities = cuda_like_capabilities();
  capabilities.max_lora_rank = 4;  // the synthetic adapters have rank 8
  auto engine = make_limited(small_config(), capabilities);
  test::expect_error([&] { engine->load_adapter("big", adapter_path(0), KvSharing::kIsolated); },
                     ErrorKind::kUnsupported, {"adapter 'big': LoRA rank 8 is above the limited backend's largest, 4"});
  EXPECT_TRUE(adapter_names(*engine).empty());
  engine->shutdown(false);
}

TEST_F(EngineBackendCapabilitiesTest, ARefusedRuntimeLoadLeavesRunningRequestsAlone) {
  auto engine = make_limited();
  engine->load_adapter("tester", adapter_path(1), KvSharing::kIsolated);
  auto first = engine->submit(request(5, 24, "tester"));
  auto second = engine->submit(request(6, 24));
  // While they run: a run-time load (POST /v1/load_lora_adapter).
  test::expect_error([&] { engine->load_adapter("critic", adapter_path(2), KvSharing::kBase); },
                     ErrorKind::kUnsupported, {"kv_sharing 'base' is not supported by the limited backend"});
  for (RequestStream* stream : {first.get(), second.get()}) {
    const Collected result = collect(*stream);
    EXPECT_FALSE(result.error.has_value()) << result.error->what();
    EXPECT_EQ(result.tokens.size(), 24u);
  }
  // And later requests still run, next to a newly loaded adapter.
  engine->load_adapter("critic", adapter_path(2), KvSharing::kActivated);
  const Collected later = collect(*engine->submit(request(7, 4, "critic")));
  EXPECT_FALSE(later.error.has_value());
  engine->shutdown(false);
  EXPECT_EQ(backend_->num_refused_batches.load(), 0);
}

TEST_F(EngineBackendCapabilitiesTest, OperatorDisabledModesAreRefusedOnTheCpuBackend) {
  EngineConfig config = small_config();
  config.disabled_kv_sharing = {KvSharing::kBase};
  auto engine = std::make_unique<EngineImpl>(*model_, cpu_backend(), config);
  test::expect_error([&] { engine->load_adapter("critic", adapter_path(1), KvSharing::kBase); },
                     ErrorKind::kUnsupported,
                     {"adapter 'critic': kv_sharing 'base' is disabled on this server by --disable-kv-sharing "
                      "(allowed: isolated, activated, forked)",
                      "load it with kv_sharing isolated, activated or forked"});
  EXPECT_TRUE(adapter_names(*engine).empty());
  engine->load_adapter("coder", adapter_path(2), KvSharing::kForked);  // not disabled: served
  const Collected forked = collect(*engine->submit(request(8, 5, "coder")));
  EXPECT_FALSE(forked.error.has_value());
  EXPECT_EQ(forked.tokens.size(), 5u);
  engine->shutdown(false);

  config.default_sharing = KvSharing::kBase;
  test::expect_error([&] { std::make_unique<EngineImpl>(*model_, cpu_backend(), config); }, ErrorKind::kUnsupported,
                     {"--default-sharing: kv_sharing 'base' is disabled on this server by --disable-kv-sharing"});
  config.disabled_kv_sharing = all_kv_sharing_modes();
  test::expect_error([&] { std::make_unique<EngineImpl>(*model_, cpu_backend(), config); }, ErrorKind::kUnsupported,
                     {"(allowed: none)", "drop it from --disable-kv-sharing"});
}

// `loom ARGUMENTS` with a 60 s limit (a server that failed to refuse would run forever).
CommandResult run_loom(const std::string& arguments) {
  return test::run_command("timeout 60 " + test::loom_binary() + " " + arguments);
}

TEST_F(EngineBackendCapabilitiesTest, TheCliFlagRefusesAtStart) {
  const std::string model = " --model " + directory_->str();
  const std::string adapter = adapter_path(1);
  CommandResult served = run_loom("serve --port 0" + model + " --disable-kv-sharing base,forked --lora critic=" +
                                  adapter + ":base");
  EXPECT_EQ(served.exit_code, 2) << served.output;
  EXPECT_NE(served.output.find("adapter 'critic': kv_sharing 'base' is disabled on this server by "
                               "--disable-kv-sharing (allowed: isolated, activated)"),
            std::string::npos)
      << served.output;

  CommandResult default_sharing =
      run_loom("serve --port 0" + model + " --default-sharing forked --disable-kv-sharing forked");
  EXPECT_EQ(default_sharing.exit_code, 2) << default_sharing.output;
  EXPECT_NE(default_sharing.output.find("--default-sharing: kv_sharing 'forked' is disabled"), std::string::npos)
      << default_sharing.output;

  CommandResult generated = run_loom("generate" + model + " --raw --prompt hi --max-tokens 2 --disable-kv-sharing base "
                                     "--lora critic=" + adapter + ":base");
  EXPECT_EQ(generated.exit_code, 2) << generated.output;
  EXPECT_NE(generated.output.find("kv_sharing 'base' is disabled"), std::string::npos) << generated.output;
  CommandResult allowed = run_loom("generate" + model + " --raw --prompt hi --max-tokens 2 --ignore-eos "
                                   "--disable-kv-sharing base --lora critic=" + adapter + ":isolated --json");
  EXPECT_EQ(allowed.exit_code, 0) << allowed.output;

  CommandResult unknown = run_loom("generate" + model + " --prompt hi --disable-kv-sharing shared");
  EXPECT_NE(unknown.exit_code, 0) << unknown.output;
  EXPECT_NE(unknown.output.find("--disable-kv-sharing"), std::string::npos) << unknown.output;
}

}  // namespace
}  // namespace loom
