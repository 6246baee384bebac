// The KV cache's events: every block that enters or leaves a tier of a cache,
// reported to an observer as the state change happens (vLLM's KV events, which
// KV-aware routers such as llm-d's and NVIDIA Dynamo's consume; kvevents/
// encodes and publishes them). kv/ only calls the interface: no I/O here.
//
// A block is "stored" on a medium when a request could use it from there:
//
//   medium   stored when                                  removed when
//   kDevice  committed (a new tree node), loaded back     evicted from the device (it may stay on the
//            from the host, or recomputed over a host     host), dropped with its namespace, or its
//            node (adopted)                               load failed
//   kHost    its backup finished (offload), or it was     evicted from the host (a host leaf), dropped,
//            read back from the disk tier                 or removed with a device node without backup
//   kDisk    its write-through to the disk tier landed    this server trimmed it from the directory to
//            (an offload finished and the store has it)   hold the cap (DiskTierPlanner::blocks_removed)
//
// Disk blocks outlive the tree: a block stays stored on kDisk after its
// device and host copies are gone. What other servers sharing the directory
// write or remove is not announced here (they announce their own), nor are
// the files a warm start finds (their tokens are not known).
//
// so for each (cache, block) the events alternate stored / removed per medium,
// starting with stored. Blocks being copied (offloading, loading) are not
// stored on the medium being written until the copy has finished. A block is
// named by its content hash (kv_block_hash.h; the cache must have block hashes,
// KvCacheManager::enable_block_hashes) and its parent's (zero for the first
// block of a chain, under a namespace root).
//
// all_blocks_cleared: the caches were rebuilt (engine start, pools resized):
// nothing stored before is held any more.
//
// Thread: called on the engine thread (the thread that owns the caches), in
// the order the changes happen. Calls must be cheap: no I/O; an
// implementation batches them and publishes elsewhere.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "kv/kv_block_hash.h"
#include "kv/kv_cache_id.h"

namespace loom {

enum class KvMedium : uint8_t { kDevice, kHost, kDisk };

struct KvStoredBlock {
  KvCacheId cache = KvCacheId::kMain;
  KvMedium medium = KvMedium::kDevice;
  KvBlockHash hash;
  KvBlockHash parent_hash;          // zero: first block of its chain
  std::string_view kv_namespace;    // kv_key.h; valid during the call
  std::span<const int32_t> tokens;  // the block's block_size tokens; valid during the call
};

class KvEventSink {
 public:
  virtual ~KvEventSink() = default;
  virtual void block_stored(const KvStoredBlock& block) = 0;
  virtual void block_removed(KvCacheId cache, KvMedium medium, const KvBlockHash& hash) = 0;
  virtual void all_blocks_cleared() = 0;
};

}  // namespace loom
