// KV sharing modes: names, the per-adapter choice, the checks and the aLoRA
// invocation start (lora/kv_sharing.h).
#include "lora/kv_sharing.h"

#include <gtest/gtest.h>

#include "lora/adapter.h"
#include "model/config.h"
#include "test_util.h"

namespace loom {
namespace {

TEST(KvSharingTest, NamesRoundTripAndUnknownSpellingsAreRejected) {
  for (KvSharing sharing : {KvSharing::kIsolated, KvSharing::kActivated, KvSharing::kBase, KvSharing::kForked})
    EXPECT_EQ(parse_kv_sharing(kv_sharing_name(sharing)), sharing);
  EXPECT_STREQ(kv_sharing_name(KvSharing::kBase), "base");
  EXPECT_STREQ(kv_sharing_name(KvSharing::kForked), "forked");
  EXPECT_EQ(parse_kv_sharing("Forked"), std::nullopt);
  EXPECT_EQ(parse_kv_sharing(""), std::nullopt);
  EXPECT_EQ(parse_kv_sharing("shared"), std::nullopt);
}

TEST(KvSharingTest, ChoiceFollowsTheOrderOfPrecedence) {
  LoraConfig plain;
  LoraConfig alora;
  alora.alora_invocation_tokens = {5, 6};
  LoraConfig self_described;
  self_described.loom_kv_sharing = "base";

  // The request wins over everything.
  EXPECT_EQ(choose_kv_sharing(alora, KvSharing::kForked, KvSharing::kBase), KvSharing::kForked);
  EXPECT_EQ(choose_kv_sharing(self_described, KvSharing::kIsolated, KvSharing::kForked), KvSharing::kIsolated);
  // Then adapter_config.json's loom_kv_sharing, even over invocation tokens.
  self_described.alora_invocation_tokens = {5};
  EXPECT_EQ(choose_kv_sharing(self_described, std::nullopt, KvSharing::kForked), KvSharing::kBase);
  // Then activated for an aLoRA, over the server default.
  EXPECT_EQ(choose_kv_sharing(alora, std::nullopt, KvSharing::kForked), KvSharing::kActivated);
  // Then the server default, never activated without invocation tokens.
  EXPECT_EQ(choose_kv_sharing(plain, std::nullopt, KvSharing::kIsolated), KvSharing::kIsolated);
  EXPECT_EQ(choose_kv_sharing(plain, std::nullopt, KvSharing::kBase), KvSharing::kBase);
  EXPECT_EQ(choose_kv_sharing(plain, std::nullopt, KvSharing::kForked), KvSharing::kForked);
  EXPECT_EQ(choose_kv_sharing(plain, std::nullopt, KvSharing::kActivated), KvSharing::kIsolated);

  LoraConfig misspelled;
  misspelled.loom_kv_sharing = "shared";
  test::expect_error([&] { choose_kv_sharing(misspelled, std::nullopt, KvSharing::kIsolated); },
                     ErrorKind::kInvalidArgument, {"shared", "isolated, activated, base, forked"});
}

LoraAdapter adapter_targeting(std::vector<LoraTarget> targets) {
  LoraAdapter adapter;
  adapter.name = "agent";
  adapter.path = "/adapters/agent";
  adapter.layers.resize(2);
  for (LoraTarget target : targets) adapter.layers[1][static_cast<size_t>(target)] = LoraModuleWeights{{}, {}, 4, 2.0f};
  return adapter;
}

TEST(KvSharingTest, ChecksRejectWhatCannotBeServedAndWarnAboutIgnoredModules) {
  ModelConfig llama;
  ModelConfig qwen3;
  qwen3.qk_norm = true;
  const LoraAdapter q_only = adapter_targeting({LoraTarget::kQ, LoraTarget::kO});
  const LoraAdapter with_kv = adapter_targeting({LoraTarget::kQ, LoraTarget::kK, LoraTarget::kV});
  const LoraAdapter with_v = adapter_targeting({LoraTarget::kV, LoraTarget::kUp});

  EXPECT_EQ(check_kv_sharing(KvSharing::kIsolated, with_kv, qwen3), "");
  // Activated needs invocation tokens.
  test::expect_error([&] { check_kv_sharing(KvSharing::kActivated, with_kv, llama); }, ErrorKind::kInvalidArgument,
                     {"agent", "alora_invocation_tokens"});
  LoraAdapter alora = with_kv;
  alora.config.alora_invocation_tokens = {3, 4};
  EXPECT_EQ(check_kv_sharing(KvSharing::kActivated, alora, qwen3), "");
  // Base ignores k/v LoRA, with a warning naming what is ignored.
  EXPECT_EQ(check_kv_sharing(KvSharing::kBase, q_only, llama), "");
  const std::string both = check_kv_sharing(KvSharing::kBase, with_kv, llama);
  EXPECT_NE(both.find("k_proj and v_proj"), std::string::npos) << both;
  const std::string v_only = check_kv_sharing(KvSharing::kBase, with_v, llama);
  EXPECT_NE(v_only.find("v_proj"), std::string::npos) << v_only;
  EXPECT_EQ(v_only.find("k_proj"), std::string::npos) << v_only;
  // Forked: not with q/k norm.
  EXPECT_EQ(check_kv_sharing(KvSharing::kForked, with_kv, llama), "");
  test::expect_error([&] { check_kv_sharing(KvSharing::kForked, with_kv, qwen3); }, ErrorKind::kUnsupported,
                     {"agent", "q/k norm"});
}

TEST(KvSharingTest, InvocationStartIsTheLastOccurrence) {
  const std::vector<int32_t> invocation = {7, 8};
  auto start = [&](std::vector<int32_t> prompt) { return find_alora_invocation_start(prompt, invocation); };
  EXPECT_EQ(start({1, 2, 7, 8, 3}), 2);
  EXPECT_EQ(start({7, 8, 1, 7, 8, 2}), 3);       // last of two
  EXPECT_EQ(start({1, 7, 8}), 1);                // at the very end
  EXPECT_EQ(start({7, 8}), 0);                   // the whole prompt
  EXPECT_EQ(start({7, 7, 8, 8}), 1);             // overlapping first token
  EXPECT_EQ(start({1, 7, 2, 8}), std::nullopt);  // not contiguous
  EXPECT_EQ(start({8, 7}), std::nullopt);
  EXPECT_EQ(start({7}), std::nullopt);           // shorter than the sequence
  EXPECT_EQ(start({}), std::nullopt);
  const std::vector<int32_t> single = {5};
  const std::vector<int32_t> prompt = {5, 1, 5, 2};
  EXPECT_EQ(find_alora_invocation_start(prompt, single), 2);
  EXPECT_EQ(find_alora_invocation_start(prompt, std::span<const int32_t>{}), std::nullopt);
}

}  // namespace
}  // namespace loom
