// What one KvCacheManager reports (KvCacheManager::stats): the device tier's
// counts and, with them, its host and disk tier planners' (each fills its own).
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace loom {

struct KvCacheStats {
  int32_t num_total_blocks = 0, num_free_blocks = 0, num_cached_blocks = 0, num_in_use_blocks = 0;
  int64_t num_evicted_blocks = 0;  // since start: device blocks evicted (moved to the host or dropped)
  // Host tier (0 without one). Counters are since start, in blocks.
  int32_t num_host_total_blocks = 0, num_host_used_blocks = 0;  // used: valid backups + offloads in flight
  int64_t num_offloaded_blocks = 0;        // device -> host copies finished
  int64_t num_loaded_blocks = 0;           // host -> device copies finished (prefetches included)
  int64_t num_prefetched_blocks = 0;       // of those, started by prefetch_agent
  int64_t num_prefetch_hit_blocks = 0;     // prefetched blocks first locked by lock_prefix when ready ("in time")
  int64_t num_prefetch_late_blocks = 0;    // prefetched blocks count_late_prefetch found still loading ("late")
  int64_t num_failed_transfers = 0;
  int32_t num_host_only_blocks = 0;        // nodes whose K/V is only on the host now
  // Swap preemption (host_swap_space.h): private blocks copied out / back (finished), host blocks held now.
  int64_t num_swapped_out_blocks = 0, num_swapped_in_blocks = 0;
  int32_t num_host_swap_blocks = 0;
  // Disk tier (0 without one). Counters are since start, in blocks.
  int64_t num_disk_read_blocks = 0;        // disk -> host reads finished and joined to the tree
  int64_t num_disk_read_failed_blocks = 0; // blocks of failed disk reads
  int64_t num_disk_write_planned_blocks = 0;  // offloaded blocks named for a disk write
  int32_t num_disk_reading_blocks = 0;     // disk reads in flight now
  // Device blocks in the tree (cached, in use by a lease that committed them,
  // or loading) per namespace; host-only nodes are not counted. Private
  // (uncommitted) blocks are counted under their lease's namespace for the
  // block index they hold.
  std::map<std::string, int32_t> num_blocks_by_namespace;
};

}  // namespace loom
