// The KV cache's dtype (EngineConfig::kv_cache_dtype, --kv-cache-dtype): an FP8
// KV cache needs BackendCapabilities::fp8_kv_cache, checked when the engine is
// built (the CPU declares none), and the dtype enters every block's
// content-hash salt, so the same tokens in a bf16 and an fp8 cache never share
// a name in the host/disk tiers, the KV link or KV events, while the names of
// caches in the backend's own dtype stay what they were.
#include <gtest/gtest.h>

#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "engine/backend_support.h"
#include "engine/engine_impl.h"
#include "engine/kv_identity.h"
#include "engine/kv_pools.h"
#include "kv/kv_event_sink.h"
#include "scheduler_fake_backend.h"
#include "test_util.h"

namespace loom {
namespace {

class NullSink final : public KvEventSink {
 public:
  void block_stored(const KvStoredBlock&) override {}
  void block_removed(KvCacheId, KvMedium, const KvBlockHash&) override {}
  void all_blocks_cleared() override {}
};

EngineConfig small_config(KvCacheDtype dtype) {
  EngineConfig config;
  config.block_size = 4;
  config.num_kv_blocks = 16;
  config.kv_cache_dtype = dtype;
  return config;
}

// The names KvPools gives a prompt's full blocks in the main cache (events on, so blocks are named).
std::vector<KvBlockHash> block_names(KvCacheDtype dtype, const KvBlockHash& model = hash_string("model")) {
  test::FakeBackend backend;  // the same bytes per block whatever the dtype: only the dtype can tell them apart
  NullSink sink;
  KvPools pools(backend, small_config(dtype), model, &sink);
  pools.allocate(pools.layout(pools.initial_sizing()));
  const std::vector<int32_t> tokens = {5, 6, 7, 8, 9, 10, 11, 12, 13};
  std::vector<KvBlockHash> names;
  for (const KvBlockName& name : pools.block_names(RequestKvKeys{KvKey::single(kBaseKvNamespace), ""}, tokens))
    names.push_back(name.hash);
  return names;
}

TEST(KvCacheDtypeTest, TheDtypeSaltsEveryBlockName) {
  const std::vector<KvBlockHash> native = block_names(KvCacheDtype::kAuto);
  const std::vector<KvBlockHash> fp8 = block_names(KvCacheDtype::kFp8E4M3);
  ASSERT_EQ(native.size(), 2u);  // two full blocks of 4
  ASSERT_EQ(fp8.size(), 2u);
  EXPECT_EQ(native, block_names(KvCacheDtype::kAuto));  // names are stable
  EXPECT_EQ(fp8, block_names(KvCacheDtype::kFp8E4M3));
  for (size_t i = 0; i < native.size(); ++i) EXPECT_NE(native[i], fp8[i]) << "block " << i;
  EXPECT_NE(native, block_names(KvCacheDtype::kAuto, hash_string("another model")));
}

TEST(KvCacheDtypeTest, TheLayoutSpellingOnlyGrowsForFp8) {
  // The backend's own dtype keeps the spelling (and so the block names) of before.
  EXPECT_EQ(kv_cache_layout_spelling({16, 131072, 1, KvCacheDtype::kAuto}), "block_size=16 bytes_per_block=131072");
  EXPECT_EQ(kv_cache_layout_spelling({16, 131072, 2, KvCacheDtype::kAuto}),
            "block_size=16 bytes_per_block=131072 tensor_parallel=2");
  EXPECT_EQ(kv_cache_layout_spelling({16, 65536, 2, KvCacheDtype::kFp8E4M3}),
            "block_size=16 bytes_per_block=65536 tensor_parallel=2 kv_dtype=fp8_e4m3");
  const KvBlockHash model = hash_string("model");
  EXPECT_NE(kv_cache_salt(model, kv_cache_layout_spelling({16, 65536, 1, KvCacheDtype::kAuto}), "main"),
            kv_cache_salt(model, kv_cache_layout_spelling({16, 65536, 1, KvCacheDtype::kFp8E4M3}), "main"));
}

TEST(KvCacheDtypeTest, AnFp8KvCacheNeedsTheCapability) {
  ModelConfig model;
  model.head_dim = 16;
  BackendCapabilities capabilities;
  capabilities.name = "gpu";
  capabilities.kv_sharing_modes = all_kv_sharing_modes();
  test::expect_error([&] { check_engine_supported(capabilities, small_config(KvCacheDtype::kFp8E4M3), model); },
                     ErrorKind::kUnsupported, {"FP8 KV cache", "--kv-cache-dtype fp8", "gpu backend"});
  EXPECT_NO_THROW(check_engine_supported(capabilities, small_config(KvCacheDtype::kAuto), model));
  capabilities.fp8_kv_cache = true;
  EXPECT_NO_THROW(check_engine_supported(capabilities, small_config(KvCacheDtype::kFp8E4M3), model));
}

// The CPU declares no FP8 KV cache, so an engine over it asked for one is never built.
TEST(KvCacheDtypeTest, TheCpuEngineRefusesAnFp8KvCacheAtStart) {
  test::TempDir directory;
  const LoadedModel model = test::write_and_load_synthetic_model(directory, 0);
  EXPECT_FALSE(make_cpu_backend(model.config, model.weights)->capabilities().fp8_kv_cache);
  test::expect_error(
      [&] { EngineImpl engine(model, make_cpu_backend(model.config, model.weights), small_config(KvCacheDtype::kFp8E4M3)); },
      ErrorKind::kUnsupported, {"FP8 KV cache", "cpu backend", "auto"});
  EXPECT_NO_THROW(EngineImpl(model, make_cpu_backend(model.config, model.weights), small_config(KvCacheDtype::kAuto)));
}

// --quantization fp8 quantizes 16-bit weights at load, after the host weights
// were fingerprinted: the engine's identity adds the weight format, so an FP8
// engine's blocks never share a name with the 16-bit model's.
TEST(KvCacheDtypeTest, WeightsQuantizedAtLoadChangeTheModelIdentity) {
  test::TempDir directory;
  const LoadedModel model = test::write_and_load_synthetic_model(directory, 0);
  const KvBlockHash file = model_fingerprint(model);
  EXPECT_EQ(engine_model_identity(model, false), file);  // the file's own format: the names of before
  const KvBlockHash fp8 = engine_model_identity(model, true);
  EXPECT_NE(fp8, file);
  EXPECT_EQ(fp8, engine_model_identity(model, true));  // stable across processes
  EXPECT_NE(block_names(KvCacheDtype::kAuto, fp8), block_names(KvCacheDtype::kAuto, file));
}

TEST(KvCacheDtypeTest, Fp8WeightsNeedTheCapability) {
  ModelConfig model;
  model.head_dim = 16;
  BackendCapabilities capabilities;
  capabilities.name = "gpu";
  capabilities.kv_sharing_modes = all_kv_sharing_modes();
  EngineConfig config = small_config(KvCacheDtype::kAuto);
  config.fp8_weights = true;
  test::expect_error([&] { check_engine_supported(capabilities, config, model); }, ErrorKind::kUnsupported,
                     {"FP8 weights", "--quantization fp8", "gpu backend"});
  capabilities.fp8_weights = true;
  EXPECT_NO_THROW(check_engine_supported(capabilities, config, model));
}

}  // namespace
}  // namespace loom
