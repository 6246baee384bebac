// Token lists for the KV cache manager tests (kv_host_tier, kv_disk_tier,
// kv_events): whole 4-token blocks of consecutive ids.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/radix_tree.h"

namespace loom::test {

inline constexpr int32_t kKvTestBlock = 4;
using KvTestTokens = std::vector<KvTokenId>;

// num_blocks blocks of kKvTestBlock tokens: first, first + 1, ...
inline KvTestTokens block_tokens(KvTokenId first, int32_t num_blocks) {
  KvTestTokens tokens(static_cast<size_t>(num_blocks * kKvTestBlock));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = first + static_cast<KvTokenId>(i);
  return tokens;
}

inline KvTestTokens concat(KvTestTokens a, const KvTestTokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace loom::test
