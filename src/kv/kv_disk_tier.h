// What a KvCacheManager needs to know of the disk tier (kv_cache_manager.h
// "Disk tier"): how to name blocks (kv/kv_block_hash.h) and which names the
// store holds. The store itself (files, I/O) is kvstore/; the manager only
// plans, as for the host tier.
#pragma once

#include <functional>
#include <string>

#include "kv/kv_block_hash.h"

namespace loom {

// Which blocks the disk tier holds. Implemented over kvstore/'s DiskKvStore by
// the engine; by a set in tests.
class KvBlockDirectory {
 public:
  virtual ~KvBlockDirectory() = default;
  // Engine thread; cheap (an index lookup, at most one stat).
  virtual bool contains(const KvBlockHash& hash) = 0;
};

struct KvDiskTierConfig {
  // The start of every chain in this cache: model fingerprint, KV layout and
  // which member of the group (kv_block_hash.h "cache salt").
  KvBlockHash cache_salt;
  // A namespace's salt: its spelling and, for an adapter's namespace, the
  // adapter's fingerprint. Called on the engine thread at each insert.
  std::function<KvBlockHash(const std::string& kv_namespace)> namespace_salt;
  // Must outlive the manager.
  KvBlockDirectory* directory = nullptr;
};

}  // namespace loom
