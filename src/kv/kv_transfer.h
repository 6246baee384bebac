// A copy between KV tiers: planned by a tier planner (kv/host_tier_planner.h:
// offloads and loads; kv/disk_tier_planner.h: disk reads), run by someone else
// (the engine's kv_transfer_worker), and handed back to the KvCacheManager
// that planned it (finish_transfer), which gives it to the planner owning it.
#pragma once

#include <cstdint>
#include <vector>

#include "kv/kv_block_hash.h"

namespace loom {

enum class KvLoadReason : uint8_t { kDemand, kPrefetch };

struct KvTransfer {
  enum class Kind : uint8_t { kOffload, kLoad, kDiskRead };
  int64_t id = 0;
  Kind kind = Kind::kOffload;
  KvLoadReason reason = KvLoadReason::kDemand;  // loads and disk reads
  std::vector<int32_t> device_block_ids;        // copy device_block_ids[i] <-> host_block_ids[i] (none for kDiskRead)
  std::vector<int32_t> host_block_ids;
  // kOffload with a disk tier: block_hashes[i] names host_block_ids[i] on
  // disk (zero: do not write it); kDiskRead: the blocks to read into
  // host_block_ids[i]. Empty otherwise.
  std::vector<KvBlockHash> block_hashes;
};

// Transfer ids of one manager, shared by its planners: increasing in planning
// order, so that merging the planners' transfers by id keeps that order.
class KvTransferIds {
 public:
  int64_t next() { return next_++; }

 private:
  int64_t next_ = 1;
};

}  // namespace loom
