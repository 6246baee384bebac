#include <gtest/gtest.h>

#include "oracles/block_allocator.h"

namespace loom {

TEST(BlockAllocator, AllocatesLowestIdsFirstAndReportsNoRoom) {
  BlockAllocator allocator(4);
  auto first = allocator.allocate(3);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_FALSE(allocator.allocate(2).has_value());
  EXPECT_EQ(allocator.num_free_blocks(), 1);
  allocator.free({1});
  auto second = allocator.allocate(2);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(*second, (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(allocator.num_free_blocks(), 0);
}

TEST(BlockAllocator, DoubleFreeIsAnInvariantFailure) {
  BlockAllocator allocator(2);
  auto ids = allocator.allocate(1);
  allocator.free(*ids);
  EXPECT_THROW(allocator.free(*ids), std::exception);
}

}  // namespace loom
