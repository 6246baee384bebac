// Where the cached prefix of some tokens lives in one KvCacheManager, as
// counts and block ids (KvCacheManager::prefix_location): what the scheduler
// plans on, so that it never walks the radix tree's nodes.
//
//   blocks:  [device ...][loading ...][host ...] | [being read | on disk ...]
//            the tree's part, root first           past it, by content hash (disk tier)
//
// The tree's part follows the tiers' invariant (kv/host_tier_planner.h): a path is device blocks, then blocks loading to the device, then
// host-only blocks. Past it, each block counts while it is being read from
// disk or on disk; the first that is neither ends the prefix.
#pragma once

#include <cstdint>
#include <vector>

namespace loom {

// Whether prefix_location looks past the tree's part on disk (a directory
// lookup per block: the scheduler skips it, and asks the disk tier directly).
enum class PrefixLookup : uint8_t { kTree, kTreeAndDisk };

struct PrefixLocation {
  int32_t block_size = 0;
  std::vector<int32_t> device_block_ids;  // what lock_prefix would lock, root first
  int32_t num_loading_blocks = 0;         // next: host -> device loads in flight (a request waits on them)
  std::vector<int32_t> host_block_ids;    // then: host-only blocks (their host block ids), which a load can fetch
  int32_t num_reading_blocks = 0;         // past the tree: being read from disk (kTreeAndDisk only)
  int32_t num_disk_blocks = 0;            // past the tree: only on disk, which a disk read can fetch (kTreeAndDisk only)

  int32_t num_device_blocks() const { return static_cast<int32_t>(device_block_ids.size()); }
  int32_t num_host_blocks() const { return static_cast<int32_t>(host_block_ids.size()); }
  // In tokens; "loading" is what a request would wait on: loads and disk reads.
  int32_t num_device_tokens() const { return num_device_blocks() * block_size; }
  int32_t num_loading_tokens() const { return (num_loading_blocks + num_reading_blocks) * block_size; }
  int32_t num_host_tokens() const { return num_host_blocks() * block_size; }
  int32_t num_disk_tokens() const { return num_disk_blocks * block_size; }
};

}  // namespace loom
