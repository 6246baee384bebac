// KV namespaces and keys: the spellings, branch blocks, and which adapter owns a namespace.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kv/kv_key.h"

namespace loom {
namespace {

TEST(KvKeyTest, NamespaceSpellings) {
  EXPECT_EQ(isolated_kv_namespace("math"), "lora/math");
  EXPECT_EQ(residual_kv_namespace("math"), "resid/math");
  EXPECT_EQ(KvKey::single("fork").kv_namespace, "fork");
  EXPECT_EQ(KvKey{}.kv_namespace, "base");
  EXPECT_TRUE(KvKey{}.branch_namespace.empty());
}

TEST(KvKeyTest, ActivatedKeyBranchesAtTheBlockHoldingTheStart) {
  const KvKey inside = activated_kv_key("cert", 37, 16);
  EXPECT_EQ(inside.kv_namespace, "base");
  EXPECT_EQ(inside.branch_namespace, "alora/cert@37");
  EXPECT_EQ(inside.branch_block, 2);
  EXPECT_EQ(inside.namespace_of_block(0), "base");
  EXPECT_EQ(inside.namespace_of_block(1), "base");
  EXPECT_EQ(inside.namespace_of_block(2), "alora/cert@37");
  EXPECT_EQ(inside.namespace_of_block(9), "alora/cert@37");

  const KvKey aligned = activated_kv_key("cert", 48, 16);
  EXPECT_EQ(aligned.branch_block, 3);
  EXPECT_EQ(aligned.namespace_of_block(2), "base");
  EXPECT_EQ(aligned.namespace_of_block(3), "alora/cert@48");

  const KvKey first_block = activated_kv_key("cert", 5, 16);
  EXPECT_EQ(first_block.branch_block, 0);
  EXPECT_EQ(first_block.namespace_of_block(0), "alora/cert@5");

  // Same block, other offset: another namespace (the block's K/V differ).
  EXPECT_NE(activated_kv_key("cert", 33, 16), inside);
  EXPECT_EQ(activated_kv_key("cert", 37, 16), inside);
}

TEST(KvKeyTest, SingleKeyNeverBranches) {
  const KvKey key = KvKey::single("lora/a");
  EXPECT_EQ(key.namespace_of_block(0), "lora/a");
  EXPECT_EQ(key.namespace_of_block(1000000), "lora/a");
}

TEST(KvKeyTest, NamespacesBelongToTheirAdapterOnly) {
  EXPECT_TRUE(kv_namespace_belongs_to_adapter("lora/a", "a"));
  EXPECT_TRUE(kv_namespace_belongs_to_adapter("resid/a", "a"));
  EXPECT_TRUE(kv_namespace_belongs_to_adapter("alora/a@37", "a"));
  EXPECT_TRUE(kv_namespace_belongs_to_adapter(activated_kv_key("a@b", 3, 16).branch_namespace, "a@b"));

  EXPECT_FALSE(kv_namespace_belongs_to_adapter("base", "a"));
  EXPECT_FALSE(kv_namespace_belongs_to_adapter("fork", "a"));
  EXPECT_FALSE(kv_namespace_belongs_to_adapter("lora/ab", "a"));
  EXPECT_FALSE(kv_namespace_belongs_to_adapter("lora/a", "ab"));
  EXPECT_FALSE(kv_namespace_belongs_to_adapter("resid/ab", "a"));
  EXPECT_FALSE(kv_namespace_belongs_to_adapter("alora/ab@37", "a"));
  EXPECT_FALSE(kv_namespace_belongs_to_adapter("alora/a@", "a"));
  EXPECT_FALSE(kv_namespace_belongs_to_adapter("alora/a@b@5", "a"));  // adapter "a@b"
  EXPECT_FALSE(kv_namespace_belongs_to_adapter("alora/a", "a"));
  EXPECT_FALSE(kv_namespace_belongs_to_adapter("xlora/a", "a"));
}

// adapter_of_kv_namespace is the inverse of kv_namespace_belongs_to_adapter.
TEST(KvKeyTest, AdapterOfNamespaceAgreesWithBelongsToAdapter) {
  const std::vector<std::string> names = {"a", "ab", "a@b", "b"};
  const std::vector<std::string> namespaces = {"lora/a", "resid/a", "alora/a@37", "alora/a@b@3", "base", "fork",
                                               "lora/ab", "resid/ab", "alora/ab@37", "alora/a@", "alora/a",
                                               "xlora/a", "alora/a@b", "lora/a@b", "alora/@5"};
  for (const std::string& kv_namespace : namespaces)
    for (const std::string& name : names)
      EXPECT_EQ(kv_namespace_belongs_to_adapter(kv_namespace, name), adapter_of_kv_namespace(kv_namespace) == name)
          << kv_namespace << " / " << name;
  EXPECT_EQ(adapter_of_kv_namespace("alora/a@b@3"), "a@b");
  EXPECT_EQ(adapter_of_kv_namespace("base"), std::nullopt);
}

}  // namespace
}  // namespace loom
