// The CPU backend's host tier (Backend::allocate_host_kv_cache / copy_kv_blocks):
// blocks copied device -> host -> other device blocks decode bit-identically,
// for the main pool and for the rCache of a forked adapter; bad ids and sizes
// are rejected before anything is copied; a backend without a host tier says so.
#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "reference_model.h"
#include "util/error.h"

// SequenceInput is filled with designated initializers, leaving defaults out on purpose.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace loom {
namespace {

using test::make_batch;
using test::SequenceInput;

constexpr int kBlockSize = 4;
constexpr int kNumDeviceBlocks = 16;
constexpr int kNumHostBlocks = 6;
constexpr int kMaxRank = 8;
constexpr int kSlot = 1;
constexpr int kPromptLength = 10;  // three blocks, the last one partly filled
//                                                       q  k  v  o  gate up down
constexpr std::array<int, kNumLoraTargets> kRanks = {8, 4, 2, 6, 3, 5, 7};

struct Model {
  ModelConfig config = test::tiny_config(Architecture::kLlama);
  std::shared_ptr<ModelWeights> weights = test::random_weights(config, 91);
};

std::unique_ptr<Backend> new_backend(const Model& model) {
  auto backend = make_cpu_backend(model.config, model.weights, {.num_threads = 2, .max_adapter_slots = 2});
  backend->allocate_kv_cache({kNumDeviceBlocks, kBlockSize});
  return backend;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float worst = 0.0f;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

ErrorKind error_kind_of(const std::function<void()>& call, std::string* message = nullptr) {
  try {
    call();
  } catch (const Error& error) {
    if (message != nullptr) *message = error.message();
    return error.kind();
  }
  ADD_FAILURE() << "no loom::Error thrown";
  return ErrorKind::kInternal;
}

TEST(CpuBackendHostTier, MainPoolRoundTripDecodesBitIdentically) {
  const Model model;
  auto backend = new_backend(model);
  backend->allocate_host_kv_cache(KvPoolKind::kMain, kNumHostBlocks);
  EXPECT_EQ(backend->num_host_kv_blocks(KvPoolKind::kMain), kNumHostBlocks);
  EXPECT_EQ(backend->num_host_kv_blocks(KvPoolKind::kResidual), 0);

  const auto prompt = test::random_tokens(92, kPromptLength, model.config.vocab_size);
  const std::vector<int32_t> original = {7, 2, 11};
  const std::vector<int32_t> host = {3, 0, 5};
  const std::vector<int32_t> moved = {1, 9, 4};
  const std::vector<int32_t> never_written = {12, 13, 14};
  backend->forward(make_batch({{.tokens = prompt, .block_ids = original}}));

  // Out in two transfers, back in one, in another order.
  backend->copy_kv_blocks(KvPoolKind::kMain, KvCopyDirection::kDeviceToHost, std::span(original).first(1),
                          std::span(host).first(1));
  backend->copy_kv_blocks(KvPoolKind::kMain, KvCopyDirection::kDeviceToHost, std::span(original).subspan(1),
                          std::span(host).subspan(1));
  const std::vector<int32_t> host_reversed(host.rbegin(), host.rend());
  const std::vector<int32_t> moved_reversed(moved.rbegin(), moved.rend());
  backend->copy_kv_blocks(KvPoolKind::kMain, KvCopyDirection::kHostToDevice, moved_reversed, host_reversed);

  const int32_t next = 5;
  auto decode = [&](const std::vector<int32_t>& blocks) {
    return backend->forward(make_batch({{.tokens = {next}, .num_computed_tokens = kPromptLength, .block_ids = blocks}}))
        .logits;
  };
  const std::vector<float> with_original = decode(original);
  const std::vector<float> with_moved = decode(moved);
  const std::vector<float> with_never_written = decode(never_written);
  ASSERT_EQ(with_original.size(), static_cast<size_t>(model.config.vocab_size));
  EXPECT_EQ(with_moved, with_original);  // bit-identical
  EXPECT_GT(max_abs_diff(with_never_written, with_original),
            1e-3);
}

TEST(CpuBackendHostTier, ResidualPoolRoundTripOfAForkedAdapter) {
  const Model model;
  auto backend = new_backend(model);
  backend->allocate_residual_cache({kNumDeviceBlocks, kBlockSize, kMaxRank});
  backend->set_adapter(kSlot, test::random_adapter(model.config, 93, kRanks, 16.0f));
  backend->allocate_host_kv_cache(KvPoolKind::kMain, kNumHostBlocks);
  backend->allocate_host_kv_cache(KvPoolKind::kResidual, kNumHostBlocks);
  EXPECT_EQ(backend->num_host_kv_blocks(KvPoolKind::kResidual), kNumHostBlocks);

  const auto prompt = test::random_tokens(94, kPromptLength, model.config.vocab_size);
  const std::vector<int32_t> main_original = {7, 2, 11}, main_moved = {1, 9, 4};
  const std::vector<int32_t> residual_original = {5, 14, 0}, residual_moved = {8, 3, 10};
  const std::vector<int32_t> main_host = {4, 1, 2}, residual_host = {0, 5, 3};
  auto sequence = [&](std::vector<int32_t> tokens, int32_t num_cached, const std::vector<int32_t>& main_blocks,
                      const std::vector<int32_t>& residual_blocks) {
    return SequenceInput{.tokens = std::move(tokens), .adapter_slot = kSlot, .num_computed_tokens = num_cached,
                         .block_ids = main_blocks, .forked_adapter_slot = kSlot,
                         .residual_block_ids = residual_blocks};
  };
  backend->forward(make_batch({sequence(prompt, 0, main_original, residual_original)}));
  backend->copy_kv_blocks(KvPoolKind::kMain, KvCopyDirection::kDeviceToHost, main_original, main_host);
  backend->copy_kv_blocks(KvPoolKind::kResidual, KvCopyDirection::kDeviceToHost, residual_original, residual_host);
  backend->copy_kv_blocks(KvPoolKind::kMain, KvCopyDirection::kHostToDevice, main_moved, main_host);
  backend->copy_kv_blocks(KvPoolKind::kResidual, KvCopyDirection::kHostToDevice, residual_moved, residual_host);

  auto decode = [&](const std::vector<int32_t>& main_blocks, const std::vector<int32_t>& residual_blocks) {
    return backend->forward(make_batch({sequence({5}, kPromptLength, main_blocks, residual_blocks)})).logits;
  };
  const std::vector<float> with_original = decode(main_original, residual_original);
  EXPECT_EQ(decode(main_moved, residual_moved), with_original);
  // The rCache matters: the moved base blocks with residual blocks never written differ.
  const std::vector<float> without_residuals = decode(main_moved, {11, 12, 13});
  EXPECT_GT(max_abs_diff(without_residuals, with_original),
            1e-3);
}

TEST(CpuBackendHostTier, RejectsBadIdsBeforeCopyingAnything) {
  const Model model;
  auto backend = new_backend(model);
  const std::vector<int32_t> one = {0};
  // No host pool yet.
  EXPECT_EQ(error_kind_of([&] { backend->copy_kv_blocks(KvPoolKind::kMain, KvCopyDirection::kDeviceToHost, one, one); }),
            ErrorKind::kInvalidArgument);
  // No residual device pool to mirror.
  EXPECT_EQ(error_kind_of([&] { backend->allocate_host_kv_cache(KvPoolKind::kResidual, 4); }),
            ErrorKind::kInvalidArgument);
  EXPECT_EQ(error_kind_of([&] { backend->allocate_host_kv_cache(KvPoolKind::kMain, -1); }),
            ErrorKind::kInvalidArgument);
  backend->allocate_host_kv_cache(KvPoolKind::kMain, kNumHostBlocks);

  struct Case {
    std::vector<int32_t> device, host;
    std::string expected_text;
  };
  const std::vector<Case> cases = {
      {{0, kNumDeviceBlocks}, {0, 1}, "device block 16 outside a pool of 16"},
      {{0, -1}, {0, 1}, "device block -1 outside a pool of 16"},
      {{0, 1}, {0, kNumHostBlocks}, "host block 6 outside a pool of 6"},
      {{0, 1}, {-3, 1}, "host block -3 outside a pool of 6"},
      {{0, 1}, {0}, "2 device blocks to 1 host blocks"},
  };
  // Host block 0 holds block 3's data; device block 0 is never written, so
  // a copy of the valid first pair of a rejected transfer would show.
  const auto prompt = test::random_tokens(95, 16, model.config.vocab_size);
  backend->forward(make_batch({{.tokens = prompt, .block_ids = {3, 4, 5, 6}}}));
  backend->copy_kv_blocks(KvPoolKind::kMain, KvCopyDirection::kDeviceToHost, std::vector<int32_t>{3},
                          std::vector<int32_t>{0});
  auto decode_with_first_block = [&](int32_t block) {
    return backend->forward(make_batch({{.tokens = {7}, .num_computed_tokens = 16, .block_ids = {block, 4, 5, 6, 7}}}))
        .logits;
  };
  const std::vector<float> with_empty_block = decode_with_first_block(0);
  for (const Case& c : cases) {
    for (KvCopyDirection direction : {KvCopyDirection::kDeviceToHost, KvCopyDirection::kHostToDevice}) {
      std::string message;
      EXPECT_EQ(error_kind_of([&] { backend->copy_kv_blocks(KvPoolKind::kMain, direction, c.device, c.host); },
                              &message),
                ErrorKind::kInvalidArgument);
      EXPECT_NE(message.find(c.expected_text), std::string::npos) << message;
    }
  }
  EXPECT_EQ(decode_with_first_block(0), with_empty_block);
  // The valid copy does land (the check above can fail).
  backend->copy_kv_blocks(KvPoolKind::kMain, KvCopyDirection::kHostToDevice, std::vector<int32_t>{0},
                          std::vector<int32_t>{0});
  EXPECT_EQ(decode_with_first_block(0), decode_with_first_block(3));
  EXPECT_NE(decode_with_first_block(0), with_empty_block);

  // A device pool reallocated with another block size no longer matches the host layout.
  backend->allocate_kv_cache({kNumDeviceBlocks, 2 * kBlockSize});
  EXPECT_EQ(error_kind_of([&] { backend->copy_kv_blocks(KvPoolKind::kMain, KvCopyDirection::kDeviceToHost, one, one); }),
            ErrorKind::kInvalidArgument);
}

TEST(CpuBackendHostTier, CopiesRunBesideForward) {
  const Model model;
  auto backend = new_backend(model);
  backend->allocate_host_kv_cache(KvPoolKind::kMain, kNumHostBlocks);
  const auto prompt_a = test::random_tokens(96, 8, model.config.vocab_size);
  const auto prompt_b = test::random_tokens(97, 8, model.config.vocab_size);
  const std::vector<int32_t> blocks_a = {0, 1}, blocks_b = {2, 3, 4}, host_a = {0, 1}, loaded_a = {5, 6};
  backend->forward(make_batch({{.tokens = prompt_a, .block_ids = blocks_a}}));
  auto decode_b = [&](const std::vector<int32_t>& tokens, int32_t num_cached) {
    return backend->forward(make_batch({{.tokens = tokens, .num_computed_tokens = num_cached, .block_ids = blocks_b}}))
        .logits;
  };
  const std::vector<float> alone = decode_b(prompt_b, 0);
  backend->copy_kv_blocks(KvPoolKind::kMain, KvCopyDirection::kDeviceToHost, blocks_a, std::vector<int32_t>{4, 5});

  // Offloads and loads of sequence A's blocks on two threads while B prefills again.
  std::thread offloader([&] {
    for (int i = 0; i < 50; ++i)
      backend->copy_kv_blocks(KvPoolKind::kMain, KvCopyDirection::kDeviceToHost, blocks_a, host_a);
  });
  std::thread loader([&] {
    for (int i = 0; i < 50; ++i)
      backend->copy_kv_blocks(KvPoolKind::kMain, KvCopyDirection::kHostToDevice, std::vector<int32_t>{7, 8},
                              std::vector<int32_t>{4, 5});
  });
  std::vector<float> beside;
  for (int i = 0; i < 5; ++i) beside = decode_b(prompt_b, 0);
  offloader.join();
  loader.join();
  EXPECT_EQ(beside, alone);

  backend->copy_kv_blocks(KvPoolKind::kMain, KvCopyDirection::kHostToDevice, loaded_a, host_a);
  auto decode_a = [&](const std::vector<int32_t>& blocks) {
    return backend->forward(make_batch({{.tokens = {3}, .num_computed_tokens = 8, .block_ids = {blocks[0], blocks[1], 9}}}))
        .logits;
  };
  EXPECT_EQ(decode_a(loaded_a), decode_a(blocks_a));
}

// Only the pure virtuals: what a backend without a host tier inherits.
class BareBackend final : public Backend {
 public:
  void allocate_kv_cache(const KvCacheShape&) override {}
  KvCacheShape kv_cache_shape() const override { return {}; }
  int64_t kv_bytes_per_token() const override { return 0; }
  void set_adapter(int32_t, std::shared_ptr<const LoraAdapter>) override {}
  int32_t max_adapter_slots() const override { return 0; }
  ForwardResult forward(const Batch&) override { return {}; }
  BackendCapabilities capabilities() const override {
    BackendCapabilities capabilities;
    capabilities.name = "bare";
    capabilities.kv_sharing_modes = {KvSharing::kIsolated};
    return capabilities;
  }
};

TEST(CpuBackendHostTier, BackendWithoutHostTierSaysUnsupported) {
  BareBackend backend;
  EXPECT_EQ(error_kind_of([&] { backend.allocate_host_kv_cache(KvPoolKind::kMain, 4); }), ErrorKind::kUnsupported);
  const std::vector<int32_t> one = {0};
  EXPECT_EQ(error_kind_of([&] { backend.copy_kv_blocks(KvPoolKind::kMain, KvCopyDirection::kDeviceToHost, one, one); }),
            ErrorKind::kUnsupported);
  EXPECT_EQ(backend.num_host_kv_blocks(KvPoolKind::kMain), 0);
}

}  // namespace
}  // namespace loom
