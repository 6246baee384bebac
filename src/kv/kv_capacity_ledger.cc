#include "kv/kv_capacity_ledger.h"

#include <algorithm>

#include "util/error.h"

namespace loom {

KvCapacityLedger::KvCapacityLedger(const KvCacheGroup& kv_caches) : kv_caches_(kv_caches) {
  kv_caches.for_each([&](KvCacheId id, const KvCacheManager& member) {
    num_available_[id] = member.num_available_blocks();
    num_reserved_available_[id] = member.num_reserved_cached_blocks();
  });
}

PerKvCache<bool> KvCapacityLedger::short_members(const KvBlockCounts& counts) const {
  PerKvCache<bool> is_short;
  for (KvCacheId id : kAllKvCaches)
    if (counts[id] > 0 || num_available_[id] < 0) is_short[id] = !kv_caches_.has(id) || counts[id] > num_available_[id];
  return is_short;
}

bool KvCapacityLedger::can_allocate(const KvBlockCounts& counts) const {
  return !any_member(short_members(counts));
}

void KvCapacityLedger::take(const KvBlockCounts& counts) {
  LOOM_CHECK(can_allocate(counts));
  for (KvCacheId id : kAllKvCaches) {
    // Allocation takes free blocks, then evicts unreserved cached ones, then reserved ones.
    const int32_t num_unreserved = std::max(0, num_unreserved_available_blocks(id));
    if (counts[id] > num_unreserved) num_reserved_available_[id] -= counts[id] - num_unreserved;
    num_available_[id] -= counts[id];
  }
}

void KvCapacityLedger::give_back(const KvBlockCounts& counts) {
  for (KvCacheId id : kAllKvCaches) num_available_[id] += counts[id];
}

int32_t KvCapacityLedger::ref_count(KvCacheId id, int32_t block_id) const {
  const auto& deltas = ref_deltas_[id];
  const auto it = deltas.find(block_id);
  return kv_caches_[id].block_ref_count(block_id) + (it == deltas.end() ? 0 : it->second);
}

bool KvCapacityLedger::is_reserved(KvCacheId id, int32_t block_id) const {
  return kv_caches_[id].is_reserved(block_id);
}

void KvCapacityLedger::add_refs(KvCacheId id, std::span<const int32_t> block_ids) {
  for (int32_t block_id : block_ids) {
    if (ref_count(id, block_id) == 0) {
      --num_available_[id];
      if (is_reserved(id, block_id)) --num_reserved_available_[id];
    }
    ++ref_deltas_[id][block_id];
  }
}

void KvCapacityLedger::drop_refs(KvCacheId id, std::span<const int32_t> block_ids) {
  for (int32_t block_id : block_ids) {
    LOOM_CHECK(ref_count(id, block_id) > 0);
    --ref_deltas_[id][block_id];
    if (ref_count(id, block_id) == 0) {
      ++num_available_[id];
      if (is_reserved(id, block_id)) ++num_reserved_available_[id];
    }
  }
}

bool KvCapacityLedger::is_loading(KvCacheId id, const PrefixLocation& location) const {
  return location.num_loading_blocks > 0 ||
         (!location.host_block_ids.empty() && loading_host_blocks_[id].count(location.host_block_ids.front()) != 0);
}

}  // namespace loom
