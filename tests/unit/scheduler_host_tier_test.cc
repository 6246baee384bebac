// Status-aware admission with a host tier (scheduler.h policy 6):
// a request whose prefix is on the host waits while its blocks load and
// others run, resumes with a full hit, and recomputes when a load fails or
// the host holds no backup. The fake backend's K/V are scrambled after the
// offload, so a hit can only be right if the host copy really came back.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "engine/batch_builder.h"
#include "scheduler/scheduler.h"
#include "scheduler_fake_backend.h"
#include "scheduler_test_util.h"

namespace loom {
namespace {

using Tokens = std::vector<int32_t>;
constexpr int32_t kBlockSize = 4;

Tokens prompt(int32_t length, int32_t seed) {
  Tokens tokens;
  for (int32_t i = 0; i < length; ++i) tokens.push_back((seed * 31 + i * 7 + 3) % test::FakeBackend::kVocabSize);
  return tokens;
}

// Drives scheduler, manager and fake backend the way the engine does; the
// test decides when planned transfers run (copy + finish_transfer).
class Harness {
 public:
  Harness(int32_t num_blocks, int32_t num_host_blocks, HostLoadPolicy policy = HostLoadPolicy::kBackground)
      : kv_caches(num_blocks, 0, kBlockSize), scheduler(config(policy), kv_caches) {
    backend.allocate_kv_cache({num_blocks, kBlockSize});
    if (num_host_blocks > 0) {
      backend.allocate_host_kv_cache(KvPoolKind::kMain, num_host_blocks);
      cache.enable_host_tier(num_host_blocks);
    }
  }
  ~Harness() { EXPECT_EQ(cache.integrity_error(), ""); }

  static SchedulerConfig config(HostLoadPolicy policy) {
    SchedulerConfig config;
    config.max_batch_tokens = 64;
    config.host_load_policy = policy;
    return config;
  }

  void add(SchedulerRequestId id, const Tokens& tokens, int32_t max_new_tokens) {
    max_new_tokens_[id] = max_new_tokens;
    scheduler.add(id, tokens, "", kv_namespace_for_adapter(""), 0);
  }

  // Takes every planned transfer; runs (copies + finishes) those of `kind`
  // now and keeps the others pending. `succeed` = false finishes them as failed.
  void run_transfers(std::optional<KvCacheManager::Transfer::Kind> kind = std::nullopt, bool succeed = true) {
    for (auto& transfer : cache.take_transfers()) pending_.push_back(std::move(transfer));
    std::vector<KvCacheManager::Transfer> keep;
    for (auto& transfer : pending_) {
      if (kind && transfer.kind != *kind) {
        keep.push_back(std::move(transfer));
        continue;
      }
      if (succeed)
        backend.copy_kv_blocks(KvPoolKind::kMain,
                               transfer.kind == KvCacheManager::Transfer::Kind::kOffload ? KvCopyDirection::kDeviceToHost
                                                                                        : KvCopyDirection::kHostToDevice,
                               transfer.device_block_ids, transfer.host_block_ids);
      cache.finish_transfer(transfer.id, succeed);
    }
    pending_ = std::move(keep);
  }
  int32_t num_pending_transfers() {
    for (auto& transfer : cache.take_transfers()) pending_.push_back(std::move(transfer));
    return static_cast<int32_t>(pending_.size());
  }

  // One engine step: under kBlocking it waits for the blocked request's load (runs every
  // transfer) and resumes, as EngineImpl::step() does.
  ScheduledBatch step() {
    ScheduledBatch plan = scheduler.plan();
    while (!plan.blocked_on_load.empty()) {
      run_transfers();
      plan = scheduler.resume_after_loads(std::move(plan));
    }
    return run(std::move(plan));
  }
  // Runs a planned step through the backend.
  ScheduledBatch run(ScheduledBatch plan) {
    if (!plan.empty()) {
      const Batch batch = build_batch(plan, scheduler, [](SchedulerRequestId) { return -1; });
      const ForwardResult result = backend.forward(batch);
      scheduler.complete_step(plan);
      for (const ScheduledRequest& entry : plan.requests)
        if (entry.num_prefix_hit_tokens >= 0) prefix_hits[entry.id] = entry.num_prefix_hit_tokens;
      test::take_greedy_tokens(scheduler, plan, result, outputs, max_new_tokens_);
    }
    EXPECT_EQ(cache.integrity_error(), "");
    return plan;
  }
  // Steps (running backups as they come) until nothing is left.
  void run_to_completion() {
    for (int i = 0; i < 1000 && scheduler.has_work(); ++i) {
      step();
      run_transfers();
    }
    ASSERT_FALSE(scheduler.has_work());
  }

  KvCacheGroup kv_caches;
  KvCacheManager& cache = kv_caches.main();
  Scheduler scheduler;
  test::FakeBackend backend;
  std::map<SchedulerRequestId, Tokens> outputs;
  std::map<SchedulerRequestId, int32_t> prefix_hits;

 private:
  std::map<SchedulerRequestId, int32_t> max_new_tokens_;
  std::vector<KvCacheManager::Transfer> pending_;
};

// What a request generates on a fresh cache (no reuse at all).
Tokens reference_output(const Tokens& tokens, int32_t max_new_tokens) {
  Harness fresh(64, 0);
  fresh.add(1, tokens, max_new_tokens);
  fresh.run_to_completion();
  return fresh.outputs.at(1);
}

// Runs `shared` once, backs its blocks up, moves them to the host and scrambles the device.
void put_prefix_on_host(Harness& h, const Tokens& shared) {
  h.add(100, shared, 1);
  h.run_to_completion();
  h.run_transfers();
  h.cache.evict_all_cached();
  h.backend.scramble_kv();
  ASSERT_EQ(h.cache.stats().num_cached_blocks, 0);
}

TEST(SchedulerHostTierTest, LoadingRequestWaitsWhileOthersRunThenHitsItsWholePrefix) {
  Harness h(/*num_blocks=*/16, /*num_host_blocks=*/16);
  const Tokens shared = prompt(12, 1);  // 3 blocks
  put_prefix_on_host(h, shared);
  EXPECT_EQ(h.cache.prefix_location(KvKey::single("base"), shared).num_host_tokens(), 12);

  Tokens with_suffix = shared;
  with_suffix.insert(with_suffix.end(), {5, 6, 7});
  h.add(1, with_suffix, 3);
  h.add(2, prompt(6, 2), 2);  // arrives later, nothing cached

  ScheduledBatch plan = h.step();  // 1 starts its load and waits; 2 passes it
  EXPECT_EQ(plan.waiting_on_load, std::vector<SchedulerRequestId>{1});
  ASSERT_EQ(plan.requests.size(), 1u);
  EXPECT_EQ(plan.requests[0].id, 2);
  h.run_transfers(KvCacheManager::Transfer::Kind::kOffload);  // the load stays in flight
  ASSERT_EQ(h.num_pending_transfers(), 1);

  plan = h.step();  // still loading: 1 waits again, 2 decodes
  EXPECT_EQ(plan.waiting_on_load, std::vector<SchedulerRequestId>{1});
  EXPECT_EQ(h.scheduler.is_running(1), false);

  h.run_transfers();  // the load lands
  plan = h.step();
  EXPECT_TRUE(plan.waiting_on_load.empty());
  EXPECT_EQ(h.prefix_hits.at(1), 12);
  h.run_to_completion();
  EXPECT_EQ(h.outputs.at(1), reference_output(with_suffix, 3));
  EXPECT_EQ(h.outputs.at(2), reference_output(prompt(6, 2), 2));
  EXPECT_EQ(h.cache.stats().num_loaded_blocks, 3);
}

TEST(SchedulerHostTierTest, FailedLoadFallsBackToRecompute) {
  Harness h(16, 16);
  const Tokens shared = prompt(12, 3);
  put_prefix_on_host(h, shared);
  Tokens with_suffix = shared;
  with_suffix.push_back(9);
  h.add(1, with_suffix, 2);
  EXPECT_EQ(h.step().waiting_on_load, std::vector<SchedulerRequestId>{1});
  h.run_transfers(std::nullopt, /*succeed=*/false);
  const ScheduledBatch plan = h.step();
  EXPECT_TRUE(plan.waiting_on_load.empty());
  EXPECT_EQ(h.prefix_hits.at(1), 0);  // the suspect host copies are gone: recompute
  h.run_to_completion();
  EXPECT_EQ(h.outputs.at(1), reference_output(with_suffix, 2));
  EXPECT_EQ(h.cache.stats().num_failed_transfers, 1);
}

TEST(SchedulerHostTierTest, CancelledWhileLoadingLeaksNothing) {
  Harness h(16, 16);
  const Tokens shared = prompt(12, 4);
  put_prefix_on_host(h, shared);
  Tokens with_suffix = shared;
  with_suffix.push_back(2);
  h.add(1, with_suffix, 2);
  EXPECT_EQ(h.step().waiting_on_load, std::vector<SchedulerRequestId>{1});
  EXPECT_TRUE(h.scheduler.finish(1));  // cancelled mid-load
  EXPECT_EQ(h.cache.integrity_error(), "");
  h.run_transfers();
  EXPECT_EQ(h.cache.integrity_error(), "");
  const KvCacheStats stats = h.cache.stats();
  EXPECT_EQ(stats.num_in_use_blocks, 0);
  EXPECT_EQ(stats.num_cached_blocks, 3);  // the loaded prefix stays cached for the next request
  // ... which hits it without loading again.
  h.add(2, with_suffix, 2);
  const ScheduledBatch plan = h.step();
  EXPECT_TRUE(plan.waiting_on_load.empty());
  EXPECT_EQ(h.prefix_hits.at(2), 12);
  h.run_to_completion();
  EXPECT_EQ(h.outputs.at(2), reference_output(with_suffix, 2));
}

TEST(SchedulerHostTierTest, FullHostPoolDegradesToRecompute) {
  Harness h(16, /*num_host_blocks=*/1);  // room for one backup of three blocks
  const Tokens shared = prompt(12, 5);
  put_prefix_on_host(h, shared);
  const PrefixLocation status = h.cache.prefix_location(KvKey::single("base"), shared);
  EXPECT_EQ(status.num_device_tokens() + status.num_host_tokens(), 4);  // only the backed-up first block survives
  Tokens with_suffix = shared;
  with_suffix.push_back(1);
  h.add(1, with_suffix, 2);
  h.run_to_completion();
  EXPECT_EQ(h.prefix_hits.at(1), 4);
  EXPECT_EQ(h.outputs.at(1), reference_output(with_suffix, 2));
}

std::vector<SchedulerRequestId> ids(const ScheduledBatch& plan) {
  std::vector<SchedulerRequestId> ids;
  for (const ScheduledRequest& entry : plan.requests) ids.push_back(entry.id);
  return ids;
}

// Request 3 decodes; 1 arrives with its prefix on the host, then 2 with nothing cached.
struct LoadScenario {
  Tokens with_suffix;
  Tokens running = prompt(6, 5);
  Tokens later = prompt(6, 2);
};

LoadScenario start_load_scenario(Harness& h) {
  LoadScenario scenario;
  const Tokens shared = prompt(12, 1);  // 3 blocks
  put_prefix_on_host(h, shared);
  h.add(3, scenario.running, 4);
  EXPECT_EQ(ids(h.step()), std::vector<SchedulerRequestId>{3});  // its prefill: it decodes from now on
  h.run_transfers();                                              // its backups
  scenario.with_suffix = shared;
  scenario.with_suffix.insert(scenario.with_suffix.end(), {5, 6, 7});
  h.add(1, scenario.with_suffix, 3);
  h.add(2, scenario.later, 2);
  return scenario;
}

void expect_reference_outputs(Harness& h, const LoadScenario& scenario) {
  h.run_to_completion();
  EXPECT_EQ(h.prefix_hits.at(1), 12);
  EXPECT_EQ(h.outputs.at(1), reference_output(scenario.with_suffix, 3));
  EXPECT_EQ(h.outputs.at(2), reference_output(scenario.later, 2));
  EXPECT_EQ(h.outputs.at(3), reference_output(scenario.running, 4));
  EXPECT_EQ(h.cache.stats().num_loaded_blocks, 3);
}

// --host-load-policy blocking (HiCache's load-back): 1 holds its place, nobody passes it,
// and the step (3's decode with it) cannot run until its load lands; then 1 and 2 join that step.
TEST(SchedulerHostTierTest, BlockingPolicyStepWaitsForTheLoadAndNobodyPassesIt) {
  Harness h(16, 16, HostLoadPolicy::kBlocking);
  const LoadScenario scenario = start_load_scenario(h);

  ScheduledBatch plan = h.scheduler.plan();
  EXPECT_EQ(plan.blocked_on_load, std::vector<SchedulerRequestId>{1});
  EXPECT_EQ(plan.waiting_on_load, std::vector<SchedulerRequestId>{1});
  EXPECT_EQ(ids(plan), std::vector<SchedulerRequestId>{3});  // 2 does not overtake 1
  ASSERT_EQ(h.num_pending_transfers(), 1);                   // 1's load

  plan = h.scheduler.resume_after_loads(std::move(plan));  // not landed: still blocked, nothing added
  EXPECT_EQ(plan.blocked_on_load, std::vector<SchedulerRequestId>{1});
  EXPECT_EQ(ids(plan), std::vector<SchedulerRequestId>{3});
  EXPECT_FALSE(h.scheduler.is_running(2));

  h.run_transfers();  // the load lands; the same step goes on
  plan = h.scheduler.resume_after_loads(std::move(plan));
  EXPECT_TRUE(plan.blocked_on_load.empty());
  EXPECT_TRUE(plan.waiting_on_load.empty());
  EXPECT_EQ(ids(plan), (std::vector<SchedulerRequestId>{3, 1, 2}));  // rank order kept
  EXPECT_EQ(plan.requests[1].num_prefix_hit_tokens, 12);               // its whole prefix, loaded
  EXPECT_EQ(plan.requests[1].num_new_tokens, 3);
  EXPECT_EQ(plan.num_tokens(), 1 + 3 + 6);
  h.run(std::move(plan));
  expect_reference_outputs(h, scenario);
}

// --host-load-policy background (status-aware admission): 1 waits, 2 passes it and 3 keeps
// decoding while the load is in flight.
TEST(SchedulerHostTierTest, BackgroundPolicyRunsOthersWhileTheLoadIsInFlight) {
  Harness h(16, 16, HostLoadPolicy::kBackground);
  const LoadScenario scenario = start_load_scenario(h);

  ScheduledBatch plan = h.step();
  EXPECT_TRUE(plan.blocked_on_load.empty());
  EXPECT_EQ(plan.waiting_on_load, std::vector<SchedulerRequestId>{1});
  EXPECT_EQ(ids(plan), (std::vector<SchedulerRequestId>{3, 2}));  // 2 passes 1
  h.run_transfers(KvCacheManager::Transfer::Kind::kOffload);      // the load stays in flight
  ASSERT_EQ(h.num_pending_transfers(), 1);

  plan = h.step();  // a second step runs before the load lands
  EXPECT_EQ(plan.waiting_on_load, std::vector<SchedulerRequestId>{1});
  EXPECT_EQ(ids(plan), (std::vector<SchedulerRequestId>{3, 2}));
  expect_reference_outputs(h, scenario);
}

// Blocking: two requests in line with their prefixes on the host load one after the other
// before the step runs, and both run in it.
TEST(SchedulerHostTierTest, BlockingPolicyLoadsSeveralRequestsInLineBeforeTheStep) {
  Harness h(16, 16, HostLoadPolicy::kBlocking);
  std::vector<Tokens> prompts;
  for (int32_t seed : {6, 7}) {
    Tokens tokens = prompt(12, seed);
    put_prefix_on_host(h, tokens);
    tokens.push_back(seed);
    prompts.push_back(tokens);
  }
  h.add(1, prompts[0], 2);
  h.add(2, prompts[1], 2);
  ScheduledBatch plan = h.scheduler.plan();
  EXPECT_EQ(plan.blocked_on_load, std::vector<SchedulerRequestId>{1});
  h.run_transfers();
  plan = h.scheduler.resume_after_loads(std::move(plan));  // 1 in; 2's load starts and blocks the step
  EXPECT_EQ(plan.blocked_on_load, std::vector<SchedulerRequestId>{2});
  EXPECT_EQ(ids(plan), std::vector<SchedulerRequestId>{1});
  EXPECT_EQ(h.num_pending_transfers(), 1);
  h.run_transfers();
  plan = h.scheduler.resume_after_loads(std::move(plan));
  EXPECT_TRUE(plan.blocked_on_load.empty());
  ASSERT_EQ(ids(plan), (std::vector<SchedulerRequestId>{1, 2}));
  EXPECT_EQ(plan.requests[0].num_prefix_hit_tokens, 12);
  EXPECT_EQ(plan.requests[1].num_prefix_hit_tokens, 12);
  h.run(std::move(plan));
  h.run_to_completion();
  EXPECT_EQ(h.outputs.at(1), reference_output(prompts[0], 2));
  EXPECT_EQ(h.outputs.at(2), reference_output(prompts[1], 2));
}

// Blocking: a load that fails leaves the request to recompute, in the step that waited.
TEST(SchedulerHostTierTest, BlockingPolicyFailedLoadRecomputesInTheSameStep) {
  Harness h(16, 16, HostLoadPolicy::kBlocking);
  const Tokens shared = prompt(12, 3);
  put_prefix_on_host(h, shared);
  Tokens with_suffix = shared;
  with_suffix.push_back(9);
  h.add(1, with_suffix, 2);
  ScheduledBatch plan = h.scheduler.plan();
  EXPECT_EQ(plan.blocked_on_load, std::vector<SchedulerRequestId>{1});
  EXPECT_TRUE(plan.empty());
  h.run_transfers(std::nullopt, /*succeed=*/false);
  plan = h.scheduler.resume_after_loads(std::move(plan));
  EXPECT_TRUE(plan.blocked_on_load.empty());
  ASSERT_EQ(ids(plan), std::vector<SchedulerRequestId>{1});
  EXPECT_EQ(plan.requests[0].num_prefix_hit_tokens, 0);  // the suspect host copies are gone
  h.run(std::move(plan));
  h.run_to_completion();
  EXPECT_EQ(h.outputs.at(1), reference_output(with_suffix, 2));
}

}  // namespace
}  // namespace loom
