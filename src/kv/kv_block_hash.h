// Content identity of a KV block: what lets a block mean the same thing in any
// process, on any machine, after any restart (docs/design.md §2, the disk tier).
//
// A block's hash chains over everything its K/V depends on:
//
//   hash(block i) = H(hash(block i - 1) or the cache's salt for i == 0,
//                     namespace salt of block i, the block's tokens)
//
//   cache salt      the model's fingerprint (weights and config), the KV layout
//                   (dtype, block size, head shape or rCache rank) and which
//                   cache of the group it is (main / residual)
//   namespace salt  the namespace's spelling and, for an adapter's namespace,
//                   the adapter's fingerprint (its weights and config)
//
// so an activated branch ("alora/NAME@S") hanging under base blocks hashes the
// base chain before it. H is XXH3-128; 128 bits make an accidental collision
// negligible, and the disk tier checks the identity stored in each file too.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

namespace loom {

struct KvBlockHash {
  uint64_t high = 0;
  uint64_t low = 0;

  bool operator==(const KvBlockHash&) const = default;
  auto operator<=>(const KvBlockHash&) const = default;
  bool is_zero() const { return high == 0 && low == 0; }
  // 32 lowercase hex digits, high first.
  std::string hex() const;
};

// XXH3-128 of bytes, seeded by nothing.
KvBlockHash hash_bytes(std::span<const std::byte> bytes);
KvBlockHash hash_string(std::string_view text);
// Combines two hashes (order matters).
KvBlockHash hash_combine(const KvBlockHash& first, const KvBlockHash& second);
// hash(block) as above.
KvBlockHash chain_block_hash(const KvBlockHash& parent_or_salt, const KvBlockHash& namespace_salt,
                             std::span<const int32_t> tokens);

// How one cache names its blocks (KvCacheManager::enable_block_hashes): the
// disk tier files blocks by these names and KV events (kv_event_sink.h) report them.
struct KvBlockNaming {
  // The start of every chain in this cache: model fingerprint, KV layout and
  // which member of the group (the "cache salt" above).
  KvBlockHash cache_salt;
  // A namespace's salt: its spelling and, for an adapter's namespace, the
  // adapter's fingerprint. Called on the engine thread at each insert.
  std::function<KvBlockHash(const std::string& kv_namespace)> namespace_salt;
};

struct KvBlockHashLess {
  bool operator()(const KvBlockHash& a, const KvBlockHash& b) const { return a < b; }
};

}  // namespace loom
