// Workflow-aware eviction (KVFlow): KvCacheManager under kLru and
// kWorkflow, with steps from AgentStepGraph; exact eviction orders.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "workflow/agent_step_graph.h"

namespace loom {
namespace {

constexpr int32_t kBlock = 4;
using Policy = KvCacheManager::EvictionPolicy;
using Labels = std::vector<std::string>;

// A manager whose blocks carry readable labels ("X1": the expresser's second
// fixed block, "Xd4": the expresser's dynamic block of turn 4).
class LabeledCache {
 public:
  LabeledCache(int32_t num_blocks, Policy policy) : kv(num_blocks, kBlock) { kv.set_eviction_policy(policy); }

  // Runs one request: lock its cached prefix, allocate the rest (recording
  // what allocate() evicted, checked against eviction_order()), commit it all,
  // mark the agent's fixed prefix, release. Returns the evicted labels.
  Labels run(const std::string& agent_key, const std::string& letter, const std::vector<KvTokenId>& fixed,
             const std::vector<KvTokenId>& dynamic, const std::string& dynamic_label) {
    std::vector<KvTokenId> tokens = fixed;
    tokens.insert(tokens.end(), dynamic.begin(), dynamic.end());
    KvLease lease = kv.lock_prefix(kv_namespace, tokens);
    last_num_found_tokens = lease.num_found_tokens();
    const Labels predicted = labels(kv.eviction_order());
    const int32_t num_needed = static_cast<int32_t>(tokens.size()) / kBlock - lease.num_blocks();
    std::vector<int32_t> cached_before;
    for (const auto& [id, label] : label_by_block) cached_before.push_back(id);
    EXPECT_TRUE(kv.allocate(lease, num_needed));
    Labels evicted;
    for (int32_t id : cached_before) {
      if (kv.tree().node_of_block(id) == nullptr) {
        evicted.push_back(label_by_block.at(id));
        label_by_block.erase(id);
      }
    }
    // allocate() took exactly the first blocks of the predicted order.
    EXPECT_LE(evicted.size(), predicted.size());
    Labels predicted_head(predicted.begin(), predicted.begin() + std::min(evicted.size(), predicted.size()));
    Labels evicted_sorted = evicted, head_sorted = predicted_head;
    std::sort(evicted_sorted.begin(), evicted_sorted.end());
    std::sort(head_sorted.begin(), head_sorted.end());
    EXPECT_EQ(evicted_sorted, head_sorted) << "allocate() evicted other blocks than eviction_order() said";
    kv.commit(lease, tokens, static_cast<int32_t>(tokens.size()));
    const int32_t num_fixed_blocks = static_cast<int32_t>(fixed.size()) / kBlock;
    for (int32_t i = 0; i < lease.num_blocks(); ++i) {  // blocks shared with another agent keep their label
      label_by_block.try_emplace(lease.block_ids()[i],
                                 i < num_fixed_blocks ? fmt::format("{}{}", letter, i) : dynamic_label);
    }
    kv.set_agent_fixed_prefix(agent_key, KvKey::single(kv_namespace), tokens, static_cast<int32_t>(fixed.size()));
    lease.release();
    EXPECT_EQ(kv.integrity_error(), "");
    return predicted_head;
  }

  Labels labels(const std::vector<int32_t>& ids) const {
    Labels out;
    for (int32_t id : ids) out.push_back(label_by_block.count(id) ? label_by_block.at(id) : fmt::format("#{}", id));
    return out;
  }
  int32_t fixed_steps_of(const std::string& label) const {
    for (const auto& [id, name] : label_by_block)
      if (name == label) return kv.tree().node_of_block(id)->fixed_steps;
    ADD_FAILURE() << "no block " << label;
    return -2;
  }

  KvCacheManager kv;
  std::string kv_namespace{kBaseKvNamespace};
  std::map<int32_t, std::string> label_by_block;
  int32_t last_num_found_tokens = 0;
};

std::vector<KvTokenId> token_range(KvTokenId first, int32_t count) {
  std::vector<KvTokenId> tokens(static_cast<size_t>(count));
  for (int32_t i = 0; i < count; ++i) tokens[static_cast<size_t>(i)] = first + i;
  return tokens;
}

// ---- KVFlow Fig. 1: planner -> executor -> expresser -> reviewer -> planner ----

struct Turn {
  std::string agent;
  int32_t num_found_tokens;
  Labels evicted;
  bool operator==(const Turn&) const = default;
};
void PrintTo(const Turn& turn, std::ostream* os) {
  *os << "{" << turn.agent << ", cached " << turn.num_found_tokens << ", evicted ["
      << fmt::format("{}", fmt::join(turn.evicted, " ")) << "]}";
}

// Each agent: a 3-block fixed prefix of its own and a 1-block dynamic suffix
// per turn. The pool (12 blocks) holds three agents' prefixes with their
// suffixes. Warm-up runs expresser, reviewer, planner (the cache is then full),
// then the cycle goes on from the executor for five turns. Under both
// policies the running agent has steps 0 (AgentStepGraph with it running).
std::vector<Turn> run_fig1(Policy policy) {
  const AgentStepGraph graph({{AgentSpec{"planner", {"reviewer"}, JoinKind::kAll},
                               AgentSpec{"executor", {"planner"}, JoinKind::kAll},
                               AgentSpec{"expresser", {"executor"}, JoinKind::kAll},
                               AgentSpec{"reviewer", {"expresser"}, JoinKind::kAll}}});
  const std::map<std::string, std::string> letter{
      {"planner", "P"}, {"executor", "E"}, {"expresser", "X"}, {"reviewer", "R"}};
  const std::map<std::string, KvTokenId> first_token{
      {"planner", 1000}, {"executor", 2000}, {"expresser", 3000}, {"reviewer", 4000}};
  LabeledCache cache(12, policy);
  const Labels order{"expresser", "reviewer", "planner", "executor", "expresser", "reviewer", "planner", "executor"};
  std::vector<Turn> turns;
  for (int32_t turn = 0; turn < static_cast<int32_t>(order.size()); ++turn) {
    const std::string& agent = order[static_cast<size_t>(turn)];
    WorkflowProgress progress;
    progress.running = {agent};
    const std::vector<int32_t> steps = graph.steps_to_execution(progress);
    std::map<std::string, int32_t> steps_by_key;
    for (int32_t i = 0; i < graph.num_agents(); ++i) steps_by_key["wf-1/" + graph.names()[i]] = steps[i];
    cache.kv.set_agent_steps(steps_by_key);
    const Labels evicted =
        cache.run("wf-1/" + agent, letter.at(agent), token_range(first_token.at(agent), 3 * kBlock),
                  token_range(100000 + 100 * turn, kBlock), fmt::format("{}d{}", letter.at(agent), turn));
    if (turn >= 3) turns.push_back({agent, cache.last_num_found_tokens, evicted});
  }
  return turns;
}

TEST(KvWorkflowEvictionTest, Fig1CycleLruEvictsTheExpresserJustBeforeItsTurn) {
  // Executor (a miss) evicts the least recently used agent: the expresser, which runs next.
  EXPECT_EQ(run_fig1(Policy::kLru), (std::vector<Turn>{
                                        {"executor", 0, {"Xd0", "X2", "X1", "X0"}},
                                        {"expresser", 0, {"Rd1", "R2", "R1", "R0"}},
                                        {"reviewer", 0, {"Pd2", "P2", "P1", "P0"}},
                                        {"planner", 0, {"Ed3", "E2", "E1", "E0"}},
                                        {"executor", 0, {"Xd4", "X2", "X1", "X0"}},
                                    }));
}

TEST(KvWorkflowEvictionTest, Fig1CycleWorkflowPolicyKeepsTheNextAgents) {
  // Executor running: expresser 1, reviewer 2, planner 3. Dynamic suffixes go
  // first (LRU among them), then the planner's last block (furthest).
  EXPECT_EQ(run_fig1(Policy::kWorkflow), (std::vector<Turn>{
                                             {"executor", 0, {"Xd0", "Rd1", "Pd2", "P2"}},
                                             {"expresser", 12, {"Ed3"}},
                                             {"reviewer", 12, {"Xd4"}},
                                             {"planner", 8, {"Rd5", "R2"}},
                                             {"executor", 12, {"Pd6"}},
                                         }));
}

TEST(KvWorkflowEvictionTest, EvictionOrderListsEveryCachedBlockByPriority) {
  LabeledCache cache(12, Policy::kWorkflow);
  cache.kv.set_agent_steps({{"w/a", 3}, {"w/b", 1}, {"w/c", 3}});
  cache.run("w/a", "A", token_range(10, 2 * kBlock), token_range(900, kBlock), "Ad");
  cache.run("w/b", "B", token_range(20, 2 * kBlock), token_range(910, kBlock), "Bd");
  cache.run("w/c", "C", token_range(30, 2 * kBlock), token_range(920, kBlock), "Cd");
  // Dynamic first (LRU), then steps 3 (a before c: LRU within a level), then b.
  EXPECT_EQ(cache.labels(cache.kv.eviction_order()),
            (Labels{"Ad", "Bd", "Cd", "A1", "A0", "C1", "C0", "B1", "B0"}));
  // kLru ignores the marks; switching re-keys at once, and back again.
  cache.kv.set_eviction_policy(Policy::kLru);
  EXPECT_EQ(cache.kv.eviction_policy(), Policy::kLru);
  EXPECT_EQ(cache.labels(cache.kv.eviction_order()),
            (Labels{"Ad", "A1", "A0", "Bd", "B1", "B0", "Cd", "C1", "C0"}));
  EXPECT_EQ(cache.kv.integrity_error(), "");
  cache.kv.set_eviction_policy(Policy::kWorkflow);
  // Steps change: b is now far, a next.
  cache.kv.set_agent_steps({{"w/a", 0}, {"w/b", kFarAgentSteps}});
  EXPECT_EQ(cache.labels(cache.kv.eviction_order()),
            (Labels{"Ad", "Bd", "Cd", "B1", "B0", "C1", "C0", "A1", "A0"}));
  EXPECT_EQ(cache.kv.integrity_error(), "");
  // evict_all_cached follows the same order and leaves the agents unmarked.
  EXPECT_EQ(cache.kv.evict_all_cached(), 9);
  EXPECT_EQ(cache.kv.tree().agent_prefix_end("w/a"), nullptr);
  EXPECT_EQ(cache.kv.integrity_error(), "");
}

TEST(KvWorkflowEvictionTest, DefaultIsLruAndDynamicSuffixesAreUnmarked) {
  LabeledCache cache(8, Policy::kLru);
  KvCacheManager fresh(4, kBlock);
  EXPECT_EQ(fresh.eviction_policy(), Policy::kLru);
  cache.kv.set_agent_steps({{"w/a", 2}});
  cache.run("w/a", "A", token_range(10, 2 * kBlock), token_range(900, kBlock), "Ad");
  EXPECT_EQ(cache.fixed_steps_of("A0"), 2);
  EXPECT_EQ(cache.fixed_steps_of("A1"), 2);
  EXPECT_EQ(cache.fixed_steps_of("Ad"), kDynamicNodeSteps);
}

TEST(KvWorkflowEvictionTest, SharedPrefixesKeepTheSmallestStepsOfTheAgentsUnderThem) {
  LabeledCache cache(16, Policy::kWorkflow);
  // Both agents start with the same 2-block system prompt, then 1 block of their own.
  std::vector<KvTokenId> system = token_range(500, 2 * kBlock);
  std::vector<KvTokenId> a = system, b = system;
  const std::vector<KvTokenId> a_own = token_range(600, kBlock), b_own = token_range(700, kBlock);
  a.insert(a.end(), a_own.begin(), a_own.end());
  b.insert(b.end(), b_own.begin(), b_own.end());
  cache.kv.set_agent_steps({{"w/a", 5}, {"w/b", 2}});
  cache.run("w/a", "A", a, token_range(900, kBlock), "Ad");
  cache.run("w/b", "B", b, token_range(910, kBlock), "Bd");  // S0, S1 are A0, A1 (shared)
  EXPECT_EQ(cache.fixed_steps_of("A0"), 2);
  EXPECT_EQ(cache.fixed_steps_of("A1"), 2);
  EXPECT_EQ(cache.fixed_steps_of("A2"), 5);
  EXPECT_EQ(cache.fixed_steps_of("B2"), 2);
  EXPECT_EQ(cache.labels(cache.kv.eviction_order()), (Labels{"Ad", "Bd", "A2", "B2", "A1", "A0"}));
  // b moves far: the shared blocks now take a's 5; b's own block goes first.
  cache.kv.set_agent_steps({{"w/b", kFarAgentSteps}});
  EXPECT_EQ(cache.fixed_steps_of("A1"), 5);
  EXPECT_EQ(cache.labels(cache.kv.eviction_order()), (Labels{"Ad", "Bd", "B2", "A2", "A1", "A0"}));
  EXPECT_EQ(cache.kv.integrity_error(), "");
  // An agent whose fixed prefix is only the shared part marks the shared end.
  cache.kv.set_agent_steps({{"w/c", 0}});
  cache.kv.set_agent_fixed_prefix("w/c", KvKey::single(kBaseKvNamespace), system, 2 * kBlock);
  EXPECT_EQ(cache.fixed_steps_of("A1"), 0);
  EXPECT_EQ(cache.fixed_steps_of("A2"), 5);
  EXPECT_EQ(cache.kv.integrity_error(), "");
}

TEST(KvWorkflowEvictionTest, EvictingAPrefixEndKeepsTheRestAtTheAgentsSteps) {
  LabeledCache cache(6, Policy::kWorkflow);
  cache.kv.set_agent_steps({{"w/a", 4}, {"w/b", 1}});
  cache.run("w/a", "A", token_range(10, 3 * kBlock), {}, "");
  cache.run("w/b", "B", token_range(20, 3 * kBlock), {}, "");
  // A 2-block request evicts a's two last blocks; a's mark moves up to A0.
  cache.run("w/x", "Z", token_range(30, 2 * kBlock), {}, "");
  EXPECT_EQ(cache.labels(cache.kv.tree().agent_prefix_end("w/a") == nullptr
                             ? std::vector<int32_t>{}
                             : std::vector<int32_t>{cache.kv.tree().agent_prefix_end("w/a")->block_id}),
            (Labels{"A0"}));
  EXPECT_EQ(cache.fixed_steps_of("A0"), 4);
  // "w/x" was never given steps: far, so it goes before a (4) and b (1).
  EXPECT_EQ(cache.labels(cache.kv.eviction_order()), (Labels{"Z1", "Z0", "A0", "B2", "B1", "B0"}));
  // Re-marking after a recompute extends the mark again.
  cache.run("w/a", "A", token_range(10, 3 * kBlock), {}, "");
  EXPECT_EQ(cache.fixed_steps_of("A2"), 4);
  EXPECT_EQ(cache.kv.integrity_error(), "");
}

TEST(KvWorkflowEvictionTest, ForgetAgentsMakesTheirNodesDynamic) {
  LabeledCache cache(12, Policy::kWorkflow);
  cache.kv.set_agent_steps({{"wf-1/a", 0}, {"wf-2/a", 0}});
  cache.run("wf-1/a", "A", token_range(10, 2 * kBlock), token_range(900, kBlock), "Ad");
  cache.run("wf-2/a", "B", token_range(20, 2 * kBlock), token_range(910, kBlock), "Bd");
  EXPECT_EQ(cache.labels(cache.kv.eviction_order()), (Labels{"Ad", "Bd", "A1", "A0", "B1", "B0"}));
  cache.kv.forget_agents([](const std::string& key) { return key.starts_with("wf-1/"); });
  EXPECT_EQ(cache.kv.tree().num_agents(), 1);
  EXPECT_EQ(cache.fixed_steps_of("A0"), kDynamicNodeSteps);
  EXPECT_EQ(cache.fixed_steps_of("B0"), 0);
  // a's blocks are dynamic now: LRU among dynamic, before b's fixed prefix.
  EXPECT_EQ(cache.labels(cache.kv.eviction_order()), (Labels{"Ad", "A1", "A0", "Bd", "B1", "B0"}));
  EXPECT_EQ(cache.kv.integrity_error(), "");
}

TEST(KvWorkflowEvictionTest, ResidualManagerEvictsByItsOwnMarks) {
  // ForkKV's rCache is a second manager with "resid/NAME" namespaces: same machinery, own marks.
  LabeledCache base(6, Policy::kLru), residual(6, Policy::kWorkflow);
  residual.kv_namespace = "resid/x";
  for (LabeledCache* cache : {&base, &residual}) {
    cache->kv.set_agent_steps({{"w/a", 0}, {"w/b", 5}});
    cache->run("w/a", "A", token_range(10, 2 * kBlock), token_range(900, kBlock), "Ad");
    cache->run("w/b", "B", token_range(20, 2 * kBlock), token_range(910, kBlock), "Bd");
  }
  EXPECT_EQ(base.labels(base.kv.eviction_order()), (Labels{"Ad", "A1", "A0", "Bd", "B1", "B0"}));
  EXPECT_EQ(residual.labels(residual.kv.eviction_order()), (Labels{"Ad", "Bd", "B1", "B0", "A1", "A0"}));
  EXPECT_EQ(residual.kv.stats().num_blocks_by_namespace.at("resid/x"), 6);
}

TEST(KvWorkflowEvictionTest, MarksAreCheckedByIntegrityAndSurviveNamespaceDrops) {
  LabeledCache cache(8, Policy::kWorkflow);
  cache.kv.set_agent_steps({{"w/a", 1}});
  cache.run("w/a", "A", token_range(10, 2 * kBlock), {}, "");
  // An agent's prefix in another namespace (an isolated adapter), then dropped.
  const std::vector<KvTokenId> tokens = token_range(40, 2 * kBlock);
  {
    KvLease lease = cache.kv.lock_prefix("lora/x", tokens);
    ASSERT_TRUE(cache.kv.allocate(lease, 2));
    cache.kv.commit(lease, tokens, 2 * kBlock);
  }
  cache.kv.set_agent_fixed_prefix("w/b", KvKey::single("lora/x"), tokens, 2 * kBlock);
  ASSERT_NE(cache.kv.tree().agent_prefix_end("w/b"), nullptr);
  EXPECT_EQ(cache.kv.drop_namespace("lora/x"), 2);
  EXPECT_EQ(cache.kv.tree().agent_prefix_end("w/b"), nullptr);
  EXPECT_EQ(cache.kv.integrity_error(), "");
  // A stale priority is reported.
  const int32_t a1 = cache.kv.tree().agent_prefix_end("w/a")->block_id;
  cache.kv.tree().node_of_block(a1)->fixed_steps = 7;
  EXPECT_NE(cache.kv.integrity_error().find("fixed_steps"), std::string::npos) << cache.kv.integrity_error();
  cache.kv.tree().node_of_block(a1)->fixed_steps = 1;
  EXPECT_EQ(cache.kv.integrity_error(), "");
}

}  // namespace
}  // namespace loom
