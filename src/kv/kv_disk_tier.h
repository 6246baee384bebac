// What a KvCacheManager needs to know of the disk tier (kv_cache_manager.h
// "Disk tier"): which block names (kv/kv_block_hash.h; the manager names its
// blocks with enable_block_hashes first) the store holds. The store itself
// (files, I/O) is kvstore/; the manager only plans, as for the host tier.
#pragma once

#include "kv/kv_block_hash.h"

namespace loom {

// Which blocks the disk tier holds. Implemented over kvstore/'s DiskKvStore by
// the engine; by a set in tests.
class KvBlockDirectory {
 public:
  virtual ~KvBlockDirectory() = default;
  // Engine thread; cheap (an index lookup, at most one stat).
  virtual bool contains(const KvBlockHash& hash) = 0;
  // False when the "disk tier" is only a transfer buffer without storage
  // below it (a disaggregated engine's): its blocks are not announced as on disk.
  virtual bool is_persistent() const { return true; }
};

struct KvDiskTierConfig {
  // Must outlive the manager.
  KvBlockDirectory* directory = nullptr;
};

}  // namespace loom
