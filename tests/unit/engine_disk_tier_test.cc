// The disk tier through the serving engine (CPU backend, tiny random llama with
// adapters): an engine that starts over on the same directory (a restart, or a
// second server) reads the first one's blocks back disk -> host -> device and
// gives the same greedy tokens, in every sharing mode; corrupt or truncated
// files are recomputed; another adapter under the same name never hits; warm
// start indexes the directory; bad configurations fail at construction.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "engine/engine_impl.h"
#include "engine_test_util.h"
#include "model/loader.h"
#include "synthetic/synthetic_model.h"
#include "test_util.h"

namespace loom {
namespace {

constexpr int32_t kPromptTokens = 37;  // 9 full blocks of 4 are looked up (the last token is not)
constexpr int32_t kOutputTokens = 4;

// Forwards to a CPU backend, host tier included; host_kv_block hands the disk
// tier a span 4 bytes short, so every disk read of a block fails its size
// check while the store keeps the file (it is the reader that is wrong).
class ShortHostBlockBackend final : public test::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  void allocate_host_kv_cache(KvPoolKind pool, int32_t num_blocks) override {
    inner().allocate_host_kv_cache(pool, num_blocks);
  }
  int32_t num_host_kv_blocks(KvPoolKind pool) const override { return inner().num_host_kv_blocks(pool); }
  void copy_kv_blocks(KvPoolKind pool, KvCopyDirection direction, std::span<const int32_t> device_block_ids,
                      std::span<const int32_t> host_block_ids) override {
    inner().copy_kv_blocks(pool, direction, device_block_ids, host_block_ids);
  }
  std::span<std::byte> host_kv_block(KvPoolKind pool, int32_t host_block_id) override {
    std::span<std::byte> block = inner().host_kv_block(pool, host_block_id);
    return block.first(block.size() - 4);
  }
};

struct Outcome {
  std::vector<int32_t> tokens;
  int32_t num_cached_prompt_tokens = -1;
};

class EngineDiskTierTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = new test::TempDir();
    model_ = new LoadedModel(test::write_and_load_synthetic_model(*directory_, 2, /*alora_invocation=*/true));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete directory_;
  }

  std::string adapter_path(int index) const {
    return directory_->str() + "/adapters/adapter" + std::to_string(index);
  }
  EngineConfig config(bool warm_start = false) const {
    EngineConfig config = test::small_sharing_engine_config();
    config.num_host_kv_blocks = 64;
    config.disk_kv_path = disk_.str() + "/kv";
    config.disk_kv_bytes = 64 << 20;
    config.disk_kv_warm_start = warm_start;
    return config;
  }
  // An engine over the test's disk directory, serving adapter `index` as "agent" in `mode` (no adapter: index < 0).
  std::unique_ptr<EngineImpl> start(int index, KvSharing mode, bool warm_start = false,
                                    int tensor_parallel_size = 1) const {
    auto engine = std::make_unique<EngineImpl>(
        *model_, make_cpu_backend(model_->config, model_->weights, {1, 8, tensor_parallel_size}), config(warm_start));
    if (index >= 0) engine->load_adapter("agent", adapter_path(index), mode);
    return engine;
  }
  static EngineRequest request(bool adapter, bool invoke) {
    EngineRequest request;
    for (int32_t i = 0; i < kPromptTokens; ++i) request.prompt_tokens.push_back(10 + (i * 37 + i * i * 3) % 200);
    if (invoke) {  // an activated adapter's invocation near the end: the blocks before it are base blocks
      const std::vector<int> invocation = synthetic_alora_invocation_tokens(model_->config);
      request.prompt_tokens.insert(request.prompt_tokens.end() - 6, invocation.begin(), invocation.end());
    }
    request.max_new_tokens = kOutputTokens;
    request.ignore_eos = true;
    if (adapter) request.adapter = "agent";
    return request;
  }
  static Outcome run(EngineImpl& engine, const EngineRequest& request) {
    Outcome outcome;
    auto stream = engine.submit(request);
    test::read_stream(*stream, [&](const RequestOutput& output) {
      for (const SampledToken& token : output.new_tokens) outcome.tokens.push_back(token.token_id);
      outcome.num_cached_prompt_tokens = output.num_cached_prompt_tokens;
      EXPECT_FALSE(output.error.has_value()) << output.error->what();
    });
    return outcome;
  }
  // Waits until every transfer (and so every write-through) has been applied, then stops the engine.
  static void stop(std::unique_ptr<EngineImpl>& engine) {
    for (int i = 0; i < 5000; ++i) {
      int32_t in_flight = 0;
      engine->run_on_engine_thread([&] { in_flight = engine->kv_caches().num_transfers_in_flight(); });
      if (in_flight == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    engine->run_on_engine_thread([&] { EXPECT_EQ(engine->kv_caches().integrity_error(), ""); });
    engine->shutdown(false);
    engine.reset();
  }
  // `engine` serves `request` by recomputing it (its disk reads fail), with the tokens of `computed`; stops it.
  static void expect_recomputed_after_failed_reads(std::unique_ptr<EngineImpl>& engine, const EngineRequest& request,
                                                   const Outcome& computed) {
    const Outcome recomputed = run(*engine, request);
    EXPECT_EQ(recomputed.tokens, computed.tokens);
    EXPECT_EQ(recomputed.num_cached_prompt_tokens, 0);
    const EngineMetrics metrics = engine->take_metrics();
    EXPECT_GT(metrics.num_disk_read_failures, 0);
    EXPECT_EQ(metrics.num_disk_loaded_tokens, 0);
    stop(engine);
  }
  std::vector<std::filesystem::path> block_files() const {
    std::vector<std::filesystem::path> files;
    for (const auto& entry : std::filesystem::recursive_directory_iterator(disk_.path() / "kv"))
      if (entry.path().extension() == ".kv") files.push_back(entry.path());
    return files;
  }

  test::TempDir disk_;
  static test::TempDir* directory_;
  static LoadedModel* model_;
};
test::TempDir* EngineDiskTierTest::directory_ = nullptr;
LoadedModel* EngineDiskTierTest::model_ = nullptr;

// What a second engine on the directory finds of the first one's run, per mode.
struct ModeCase {
  const char* name;
  int adapter;  // -1: the base model
  KvSharing mode;
  bool invoke;
};

TEST_F(EngineDiskTierTest, EveryModeComesBackFromDiskWithTheSameTokens) {
  for (const ModeCase& mode : {ModeCase{"base model", -1, KvSharing::kIsolated, false},
                               ModeCase{"isolated", 0, KvSharing::kIsolated, false},
                               ModeCase{"activated", 0, KvSharing::kActivated, true},
                               ModeCase{"base", 0, KvSharing::kBase, false},
                               ModeCase{"forked", 0, KvSharing::kForked, false}}) {
    SCOPED_TRACE(mode.name);
    std::filesystem::remove_all(disk_.path() / "kv");
    const EngineRequest request = EngineDiskTierTest::request(mode.adapter >= 0, mode.invoke);
    const int32_t full_blocks = static_cast<int32_t>(request.prompt_tokens.size() - 1) / 4 * 4;
    auto first = start(mode.adapter, mode.mode);
    const Outcome computed = run(*first, request);
    EXPECT_EQ(computed.num_cached_prompt_tokens, 0);
    stop(first);
    EXPECT_GE(block_files().size(), static_cast<size_t>(full_blocks / 4));

    auto second = start(mode.adapter, mode.mode);  // a restart: nothing on its device or host
    const Outcome loaded = run(*second, request);
    EXPECT_EQ(loaded.tokens, computed.tokens);
    EXPECT_EQ(loaded.num_cached_prompt_tokens, full_blocks);
    const EngineMetrics metrics = second->take_metrics();
    EXPECT_GE(metrics.num_disk_loaded_tokens, full_blocks);
    EXPECT_EQ(metrics.num_disk_read_failures, 0);
    stop(second);
  }
}

// A tensor-parallel engine's blocks (its ranks' shares one after the other) come back to an engine of the same
// size, and are a miss, never wrong KV, for an engine of another size: the size is in the blocks' salt.
TEST_F(EngineDiskTierTest, TensorParallelBlocksAreReadOnlyByEnginesOfTheSameSize) {
  for (const ModeCase& mode : {ModeCase{"base model", -1, KvSharing::kIsolated, false},
                               ModeCase{"base", 0, KvSharing::kBase, false},
                               ModeCase{"forked", 0, KvSharing::kForked, false}}) {
    SCOPED_TRACE(mode.name);
    std::filesystem::remove_all(disk_.path() / "kv");
    const EngineRequest request = EngineDiskTierTest::request(mode.adapter >= 0, mode.invoke);
    const int32_t full_blocks = static_cast<int32_t>(request.prompt_tokens.size() - 1) / 4 * 4;
    auto first = start(mode.adapter, mode.mode, false, 2);
    const Outcome computed = run(*first, request);
    stop(first);
    auto second = start(mode.adapter, mode.mode, false, 2);
    const Outcome loaded = run(*second, request);
    EXPECT_EQ(loaded.tokens, computed.tokens);
    EXPECT_EQ(loaded.num_cached_prompt_tokens, full_blocks);
    stop(second);
    auto whole = start(mode.adapter, mode.mode, false, 1);
    const Outcome other_size = run(*whole, request);
    EXPECT_EQ(other_size.tokens, computed.tokens);
    EXPECT_EQ(other_size.num_cached_prompt_tokens, 0);
    stop(whole);
  }
}

TEST_F(EngineDiskTierTest, CorruptAndTruncatedBlocksAreRecomputed) {
  const EngineRequest request = EngineDiskTierTest::request(false, false);
  auto first = start(-1, KvSharing::kIsolated);
  const Outcome computed = run(*first, request);
  stop(first);
  const std::vector<std::filesystem::path> files = block_files();
  ASSERT_GE(files.size(), 9u);
  for (size_t i = 0; i < files.size(); ++i) {
    if (i % 2 == 0) {
      std::filesystem::resize_file(files[i], std::filesystem::file_size(files[i]) - 1);
    } else {  // one flipped payload byte
      std::fstream file(files[i], std::ios::in | std::ios::out | std::ios::binary);
      file.seekg(4096 + 17);
      const char byte = static_cast<char>(file.get());
      file.seekp(4096 + 17);
      file.put(static_cast<char>(byte ^ 0x20));
    }
  }
  auto second = start(-1, KvSharing::kIsolated);
  expect_recomputed_after_failed_reads(second, request, computed);
  // The bad files were dropped and the recomputed blocks written again: a third engine hits them all.
  auto third = start(-1, KvSharing::kIsolated);
  EXPECT_EQ(run(*third, request).num_cached_prompt_tokens, kPromptTokens - 1);
  stop(third);
}

TEST_F(EngineDiskTierTest, AReadThatKeepsFailingIsRecomputedNotAwaitedForever) {
  const EngineRequest request = EngineDiskTierTest::request(false, false);
  auto first = start(-1, KvSharing::kIsolated);
  const Outcome computed = run(*first, request);
  stop(first);
  auto second = std::make_unique<EngineImpl>(
      *model_, std::make_unique<ShortHostBlockBackend>(make_cpu_backend(model_->config, model_->weights, {1, 8})),
      config());
  // Without a way out the request would wait on the same read every step.
  expect_recomputed_after_failed_reads(second, request, computed);
}

TEST_F(EngineDiskTierTest, AnotherAdapterUnderTheSameNameNeverHits) {
  const EngineRequest request = EngineDiskTierTest::request(true, false);
  auto first = start(0, KvSharing::kIsolated);
  run(*first, request);
  stop(first);
  auto second = start(1, KvSharing::kIsolated);  // "agent" is now adapter1
  EXPECT_EQ(run(*second, request).num_cached_prompt_tokens, 0);
  stop(second);
}

TEST_F(EngineDiskTierTest, WarmStartIndexesWhatIsThere) {
  auto first = start(-1, KvSharing::kIsolated);
  run(*first, request(false, false));
  stop(first);
  const auto num_files = static_cast<int64_t>(block_files().size());
  auto cold = start(-1, KvSharing::kIsolated);
  EXPECT_EQ(cold->take_metrics().disk_blocks, 0);
  stop(cold);
  auto warm = start(-1, KvSharing::kIsolated, /*warm_start=*/true);
  const EngineMetrics metrics = warm->take_metrics();
  EXPECT_EQ(metrics.disk_blocks, num_files);
  EXPECT_GT(metrics.disk_bytes, 0);
  stop(warm);
}

TEST_F(EngineDiskTierTest, BadConfigurationsFailAtStart) {
  EngineConfig no_host = config();
  no_host.num_host_kv_blocks = 0;
  test::expect_error([&] { EngineImpl(*model_, make_cpu_backend(model_->config, model_->weights, {1, 8}), no_host); },
                     ErrorKind::kInvalidArgument, {"host KV tier", "--host-kv-memory"});
  EngineConfig no_cap = config();
  no_cap.disk_kv_bytes = 0;
  test::expect_error([&] { EngineImpl(*model_, make_cpu_backend(model_->config, model_->weights, {1, 8}), no_cap); },
                     ErrorKind::kInvalidArgument, {"--disk-kv-bytes"});
  EngineConfig not_a_directory = config();
  std::ofstream(disk_.path() / "file") << "x";
  not_a_directory.disk_kv_path = (disk_.path() / "file").string();
  test::expect_error(
      [&] { EngineImpl(*model_, make_cpu_backend(model_->config, model_->weights, {1, 8}), not_a_directory); },
      ErrorKind::kInvalidArgument, {"file"});
}

}  // namespace
}  // namespace loom
