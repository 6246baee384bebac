// The loader's host memory bound (docs/tensor-parallel.md, issue 37): a bf16
// checkpoint read as a GPU engine reads it (16-bit rows kept in the file
// mapping, LoadOptions::keep_quantized) and cut into tensor-parallel shards
// costs almost no anonymous memory; the fp32 read the CPU backend uses costs
// about twice the file, which shows the measurement sees the difference.
// Anonymous RSS (/proc/self/status RssAnon): mapped file pages are not in it.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "formats/safetensors.h"
#include "model/tensor_parallel.h"
#include "model/weights.h"
#include "synthetic/synthetic_model.h"
#include "test_util.h"

namespace loom {
namespace {

int64_t anonymous_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "RssAnon:") {
      int64_t kib = 0;
      status >> kib;
      return kib * 1024;
    }
    status.ignore(1 << 20, '\n');
  }
  return -1;
}

TEST(LoaderMemory, SixteenBitCheckpointAndItsShardsStayInTheFileMapping) {
  if (anonymous_rss_bytes() < 0) GTEST_SKIP() << "no RssAnon in /proc/self/status";
  // A Llama of ~490 MB in bf16: big enough that its copies would show, small enough for CI.
  ModelConfig config = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  config.hidden_size = 2048;
  config.num_heads = 16;
  config.num_kv_heads = 4;
  config.head_dim = 128;
  config.intermediate_size = 5632;
  config.num_layers = 4;
  config.vocab_size = 32000;
  test::TempDir directory;
  write_synthetic_checkpoint(directory.path().string(), config, 3, StoredDtype::kBF16);
  const int64_t file_bytes =
      static_cast<int64_t>(std::filesystem::file_size(directory.path() / "model.safetensors"));
  ASSERT_GT(file_bytes, int64_t{400} << 20);

  {
    const int64_t before = anonymous_rss_bytes();
    const ModelWeights weights = build_model_weights(
        config, read_safetensors_checkpoint(directory.path().string(), {.keep_16bit = true}), "bf16 rows");
    const int64_t read = anonymous_rss_bytes() - before;
    std::vector<ModelWeights> shards;
    for (int32_t rank = 0; rank < 2; ++rank)
      shards.push_back(shard_model_weights(config, weights, tensor_parallel_shard(config, rank, 2)));
    const int64_t sharded = anonymous_rss_bytes() - before;
    std::printf("[ loader ] %lld MB bf16 file: %lld MB anonymous after the read, %lld MB with two shards\n",
                static_cast<long long>(file_bytes >> 20), static_cast<long long>(read >> 20),
                static_cast<long long>(sharded >> 20));
    EXPECT_LT(read, file_bytes / 20) << "the 16-bit rows were copied out of the mapping";
    EXPECT_LT(sharded, file_bytes / 20) << "the shards copied their rows";
  }
  {
    const int64_t before = anonymous_rss_bytes();
    const ModelWeights weights =
        build_model_weights(config, read_safetensors_checkpoint(directory.path().string()), "fp32");
    const int64_t read = anonymous_rss_bytes() - before;
    std::printf("[ loader ] the same read as fp32: %lld MB anonymous\n", static_cast<long long>(read >> 20));
    EXPECT_GT(read, file_bytes * 3 / 2);  // 4 bytes a value where the file has 2
  }
}

}  // namespace
}  // namespace loom
