// Radix tree: children keyed by (namespace, block tokens), branches under
// nodes of another namespace, removal by namespace predicate, LRU eviction,
// workflow priorities (agent marks, fixed_steps, eviction order).
#include <gtest/gtest.h>

#include <map>

#include "kv/radix_tree.h"
#include "util/error.h"

namespace loom {
namespace {

using Tokens = std::vector<KvTokenId>;
using Ids = std::vector<int32_t>;

// 8 blocks of 2 tokens.
class RadixTreeTest : public ::testing::Test {
 protected:
  BlockPool pool{8};
  RadixTree tree{pool, 2};

  void TearDown() override { EXPECT_EQ(tree.integrity_error(), ""); }

  // Inserts one block (a fresh pool block) and leaves it referenced.
  RadixNode* add(const std::string& ns, RadixNode* parent, Tokens tokens) {
    const int32_t id = pool.take_free(1).value()[0];
    return tree.insert(ns, parent, tokens, id);
  }
  void unref(RadixNode* node) {
    pool.release_ref(node->block_id);
    tree.on_ref_changed(node->block_id);
  }
  static Ids block_ids(const std::vector<RadixNode*>& path) {
    Ids ids;
    for (const RadixNode* node : path) ids.push_back(node->block_id);
    return ids;
  }
};

TEST_F(RadixTreeTest, BranchHangsUnderANodeOfAnotherNamespace) {
  RadixNode* b0 = add("base", nullptr, {1, 2});
  RadixNode* b1 = add("base", b0, {3, 4});
  RadixNode* a1 = add("alora/x@3", b0, {3, 4});  // same tokens, another namespace: another child
  RadixNode* a2 = add("alora/x@3", a1, {5, 6});
  EXPECT_EQ(b0->children.size(), 2u);
  EXPECT_EQ(a1->parent, b0);
  EXPECT_EQ(a1->kv_namespace, "alora/x@3");

  const Tokens tokens{1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(block_ids(tree.match(KvKey::single("base"), tokens)), (Ids{b0->block_id, b1->block_id}));
  EXPECT_EQ(block_ids(tree.match(KvKey{"base", "alora/x@3", 1}, tokens)),
            (Ids{b0->block_id, a1->block_id, a2->block_id}));
  // Another start in the same block does not see the branch.
  EXPECT_EQ(block_ids(tree.match(KvKey{"base", "alora/x@2", 1}, tokens)), (Ids{b0->block_id}));
  // A branch namespace has no root of its own here: looked up alone it is empty.
  EXPECT_TRUE(tree.match(KvKey::single("alora/x@3"), tokens).empty());
  EXPECT_EQ(tree.find_child("alora/x@3", b0, Tokens{3, 4}), a1);
  EXPECT_EQ(tree.find_child("base", b0, Tokens{3, 4}), b1);
  EXPECT_EQ(tree.find_child("base", nullptr, Tokens{1, 2}), b0);
  EXPECT_EQ(tree.find_child("alora/x@3", nullptr, Tokens{1, 2}), nullptr);

  const std::map<std::string, int32_t> expected{{"alora/x@3", 2}, {"base", 2}};
  EXPECT_EQ(tree.num_nodes_by_namespace(), expected);
  for (RadixNode* node : {a2, a1, b1, b0}) unref(node);
}

TEST_F(RadixTreeTest, BranchAtBlockZeroStartsAtItsOwnRoot) {
  RadixNode* a0 = add("alora/x@1", nullptr, {1, 2});
  add("base", nullptr, {1, 2});
  EXPECT_EQ(block_ids(tree.match(KvKey{"base", "alora/x@1", 0}, Tokens{1, 2})), (Ids{a0->block_id}));
  EXPECT_EQ(tree.match(KvKey::single("base"), Tokens{1, 2}).size(), 1u);
  for (int32_t id : {0, 1}) {
    pool.release_ref(id);
    tree.on_ref_changed(id);
  }
}

TEST_F(RadixTreeTest, RemoveNamespacesTakesDescendantsAndKeepsTheRest) {
  RadixNode* b0 = add("base", nullptr, {1, 2});     // block 0
  RadixNode* b1 = add("base", b0, {3, 4});          // 1
  RadixNode* a1 = add("alora/x@3", b0, {3, 4});     // 2
  RadixNode* deep = add("other", a1, {5, 6});       // 3: a descendant of another namespace
  RadixNode* y1 = add("alora/y@3", b0, {3, 4});     // 4
  RadixNode* l0 = add("lora/x", nullptr, {1, 2});   // 5
  for (RadixNode* node : {deep, a1, y1, b1, l0, b0}) unref(node);
  EXPECT_EQ(tree.num_cached_blocks(), 6);

  Ids removed = tree.remove_namespaces([](const std::string& ns) { return ns == "alora/x@3" || ns == "lora/x"; });
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, (Ids{2, 3, 5}));
  for (int32_t id : removed) pool.put_free(id);
  EXPECT_EQ(tree.num_nodes(), 3);
  EXPECT_EQ(tree.num_cached_blocks(), 3);
  EXPECT_EQ(tree.node_of_block(3), nullptr);
  EXPECT_EQ(tree.match(KvKey::single("base"), Tokens{1, 2, 3, 4}).size(), 2u);
  EXPECT_EQ(tree.match(KvKey{"base", "alora/y@3", 1}, Tokens{1, 2, 3, 4}).size(), 2u);
  EXPECT_EQ(tree.match(KvKey::single("lora/x"), Tokens{1, 2}).size(), 0u);
  const std::map<std::string, int32_t> expected{{"alora/y@3", 1}, {"base", 2}};
  EXPECT_EQ(tree.num_nodes_by_namespace(), expected);

  // Removing "base" takes the branch hanging under it.
  removed = tree.remove_namespace("base");
  EXPECT_EQ(removed.size(), 3u);
  for (int32_t id : removed) pool.put_free(id);
  EXPECT_EQ(tree.num_nodes(), 0);
  EXPECT_TRUE(tree.num_nodes_by_namespace().empty());
}

TEST_F(RadixTreeTest, RemoveNamespacesRefusesReferencedNodesAndRemovesNothing) {
  RadixNode* b0 = add("base", nullptr, {1, 2});
  RadixNode* a1 = add("alora/x@3", b0, {3, 4});
  RadixNode* l0 = add("lora/x", nullptr, {1, 2});
  unref(l0);  // a1 and b0 stay referenced
  EXPECT_THROW(tree.remove_namespaces([](const std::string& ns) { return ns != "base"; }), Error);
  EXPECT_EQ(tree.num_nodes(), 3);
  EXPECT_EQ(tree.find_child("lora/x", nullptr, Tokens{1, 2}), l0);
  unref(a1);
  unref(b0);
}

TEST_F(RadixTreeTest, EvictsBranchLeavesBeforeTheirBaseParent) {
  RadixNode* b0 = add("base", nullptr, {1, 2});  // block 0
  RadixNode* a1 = add("alora/x@3", b0, {3, 4});  // block 1
  RadixNode* b1 = add("base", b0, {3, 4});       // block 2
  RadixNode* other = add("base", nullptr, {9, 9});  // block 3
  tree.touch(Ids{0, 1, 2, 3}, 1);
  tree.touch(Ids{2}, 2);  // b1 used later than a1
  tree.touch(Ids{3}, 5);
  for (RadixNode* node : {a1, b1, b0, other}) unref(node);
  EXPECT_EQ(tree.evict_one(), 1);  // a1: oldest leaf
  EXPECT_EQ(tree.evict_one(), 2);  // b1; then b0 (a leaf now, time 1)
  EXPECT_EQ(tree.evict_one(), 0);
  EXPECT_EQ(tree.evict_one(), 3);
  EXPECT_EQ(tree.evict_one(), std::nullopt);
  for (int32_t id : {0, 1, 2, 3}) pool.put_free(id);
}

TEST_F(RadixTreeTest, WorkflowPolicyOrdersByMarksAndMovesMarksUpOnEviction) {
  RadixNode* b0 = add("base", nullptr, {1, 2});     // block 0: shared by both agents
  RadixNode* p1 = add("base", b0, {3, 4});          // block 1: planner's prefix end
  RadixNode* e1 = add("base", b0, {5, 6});          // block 2: executor's prefix end
  RadixNode* d2 = add("base", p1, {7, 8});          // block 3: a dynamic suffix
  RadixNode* other = add("base", nullptr, {9, 9});  // block 4: dynamic, older than the rest
  tree.touch(Ids{4}, 1);
  tree.touch(Ids{0, 1, 2, 3}, 2);
  for (RadixNode* node : {d2, p1, e1, b0, other}) unref(node);
  tree.set_agent_steps("w/planner", 3);
  tree.set_agent_prefix_end("w/planner", p1);
  tree.set_agent_prefix_end("w/executor", e1);  // steps not set yet: far
  EXPECT_EQ(p1->fixed_steps, 3);
  EXPECT_EQ(e1->fixed_steps, kFarAgentSteps);
  EXPECT_EQ(b0->fixed_steps, 3);
  EXPECT_EQ(d2->fixed_steps, kDynamicNodeSteps);
  EXPECT_EQ(tree.eviction_policy(), KvEvictionPolicy::kLru);
  EXPECT_EQ(tree.eviction_order(), (Ids{4, 2, 3, 1, 0}));  // kLru ignores the marks
  tree.set_eviction_policy(KvEvictionPolicy::kWorkflow);
  EXPECT_EQ(tree.eviction_order(), (Ids{4, 3, 2, 1, 0}));
  tree.set_agent_steps("w/executor", 1);
  EXPECT_EQ(b0->fixed_steps, 1);
  EXPECT_EQ(tree.eviction_order(), (Ids{4, 3, 1, 2, 0}));
  EXPECT_EQ(tree.integrity_error(), "");
  // Evicting the planner's end moves its mark to b0; b0 keeps min(3, 1).
  EXPECT_EQ(tree.evict_one(), 4);
  EXPECT_EQ(tree.evict_one(), 3);
  EXPECT_EQ(tree.evict_one(), 1);
  EXPECT_EQ(tree.agent_prefix_end("w/planner"), b0);
  EXPECT_EQ(b0->fixed_steps, 1);
  EXPECT_EQ(tree.integrity_error(), "");
  tree.forget_agents([](const std::string& key) { return key == "w/executor"; });
  EXPECT_EQ(b0->fixed_steps, 3);
  EXPECT_EQ(e1->fixed_steps, kDynamicNodeSteps);
  EXPECT_EQ(tree.eviction_order(), (Ids{2, 0}));
  EXPECT_EQ(tree.evict_one(), 2);
  EXPECT_EQ(tree.evict_one(), 0);
  EXPECT_EQ(tree.agent_prefix_end("w/planner"), nullptr);  // its whole prefix is gone
  EXPECT_EQ(tree.num_agents(), 1);
  for (int32_t id : {0, 1, 2, 3, 4}) pool.put_free(id);
}

}  // namespace
}  // namespace loom
