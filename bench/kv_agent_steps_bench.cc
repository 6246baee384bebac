// What the workflow-aware eviction policy's bookkeeping costs the engine thread
// (issue 42: KVFlow's setting): a KvCacheManager under EvictionPolicy::kWorkflow
// holding W workflows of 10 agents, each agent's 1024-token fixed prompt plus 32
// dynamic tokens committed and marked as its fixed prefix (16-token blocks), with
// or without a host tier. Each iteration is one workflow's transition to its next
// agent: the 10 agents' steps-to-execution move (set_agent_steps, as
// WorkflowSync::sync pushes them), re-deriving the priorities of their prefixes'
// nodes. Google Benchmark; Args: {workflows, host tier on}.
#include <map>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "kv/kv_cache_manager.h"
#include "util/prng.h"

namespace loom {
namespace {

constexpr int kAgents = 10, kFixedTokens = 1024, kDynamicTokens = 32, kBlockSize = 16;

void BM_WorkflowTransition(benchmark::State& state) {
  const int workflows = static_cast<int>(state.range(0));
  const int blocks = workflows * kAgents * (kFixedTokens + kDynamicTokens) / kBlockSize;
  KvCacheManager kv(blocks + 64, kBlockSize);
  kv.set_eviction_policy(KvCacheManager::EvictionPolicy::kWorkflow);
  if (state.range(1) != 0) kv.enable_host_tier(blocks + 64);
  Prng prng(1);
  auto agent_key = [](int workflow, int agent) { return std::to_string(workflow) + "/" + std::to_string(agent); };
  for (int w = 0; w < workflows; ++w)
    for (int a = 0; a < kAgents; ++a) {
      std::vector<KvTokenId> tokens;
      for (int t = 0; t < kFixedTokens + kDynamicTokens; ++t)
        tokens.push_back(static_cast<KvTokenId>(prng.next_below(30000)));
      KvLease lease = kv.lock_prefix(kBaseKvNamespace, tokens);
      if (!kv.allocate(lease, static_cast<int32_t>(tokens.size()) / kBlockSize - lease.num_blocks())) {
        state.SkipWithError("the pool is too small");
        return;
      }
      kv.commit(lease, tokens, static_cast<int32_t>(tokens.size()));
      kv.set_agent_fixed_prefix(agent_key(w, a), KvKey::single(kBaseKvNamespace), tokens, kFixedTokens);
      lease.release();
    }
  int64_t transition = 0;
  for (auto _ : state) {
    const int w = static_cast<int>(transition % workflows);
    const int current = static_cast<int>(transition / workflows % kAgents);
    std::map<std::string, int32_t> steps;
    for (int a = 0; a < kAgents; ++a) steps[agent_key(w, a)] = (a - current + kAgents) % kAgents;
    kv.set_agent_steps(steps);
    ++transition;
  }
}
BENCHMARK(BM_WorkflowTransition)->ArgsProduct({{8, 32, 64}, {0, 1}})->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace loom

BENCHMARK_MAIN();
