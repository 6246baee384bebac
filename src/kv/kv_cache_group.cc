#include "kv/kv_cache_group.h"

#include <algorithm>

#include "util/error.h"

namespace loom {

const char* kv_cache_name(KvCacheId id) { return id == KvCacheId::kMain ? "main" : "residual"; }

KvKey RequestKvKeys::key_in(KvCacheId id) const {
  LOOM_CHECK(uses(id));
  return id == KvCacheId::kMain ? key : KvKey::single(residual_namespace);
}

int32_t RequestLeases::num_found_tokens() const {
  std::optional<int32_t> found;
  for (KvCacheId id : kAllKvCaches)
    if (leases_[id].active()) found = std::min(found.value_or(leases_[id].num_found_tokens()), leases_[id].num_found_tokens());
  return found.value_or(0);
}

void RequestLeases::release() {
  for (KvCacheId id : kAllKvCaches) leases_[id].release();
}

KvCacheGroup::KvCacheGroup(int32_t num_main_blocks, int32_t num_residual_blocks, int32_t block_size)
    : block_size_(block_size) {
  members_[KvCacheId::kMain] = std::make_unique<KvCacheManager>(num_main_blocks, block_size);
  if (num_residual_blocks > 0)
    members_[KvCacheId::kResidual] = std::make_unique<KvCacheManager>(num_residual_blocks, block_size);
}

KvCacheManager& KvCacheGroup::operator[](KvCacheId id) {
  LOOM_CHECK(has(id));
  return *members_[id];
}

const KvCacheManager& KvCacheGroup::operator[](KvCacheId id) const {
  LOOM_CHECK(has(id));
  return *members_[id];
}

void KvCacheGroup::for_each(const std::function<void(KvCacheId, KvCacheManager&)>& fn) {
  for (KvCacheId id : kAllKvCaches)
    if (has(id)) fn(id, *members_[id]);
}

void KvCacheGroup::for_each(const std::function<void(KvCacheId, const KvCacheManager&)>& fn) const {
  for (KvCacheId id : kAllKvCaches)
    if (has(id)) fn(id, *members_[id]);
}

bool KvCacheGroup::can_hold(const RequestKvKeys& keys) const {
  return std::all_of(kAllKvCaches.begin(), kAllKvCaches.end(), [&](KvCacheId id) { return !keys.uses(id) || has(id); });
}

RequestLeases KvCacheGroup::lock_prefix(const RequestKvKeys& keys, std::span<const KvTokenId> tokens,
                                        std::optional<KvBlockCounts> max_blocks) {
  return reference_prefix(keys, tokens, max_blocks, true);
}

RequestLeases KvCacheGroup::hold_prefix(const RequestKvKeys& keys, std::span<const KvTokenId> tokens,
                                        std::optional<KvBlockCounts> max_blocks) {
  return reference_prefix(keys, tokens, max_blocks, false);
}

RequestLeases KvCacheGroup::reference_prefix(const RequestKvKeys& keys, std::span<const KvTokenId> tokens,
                                             const std::optional<KvBlockCounts>& max_blocks, bool mark_used) {
  LOOM_CHECK(can_hold(keys));
  RequestLeases leases;
  for (KvCacheId id : kAllKvCaches) {
    if (!keys.uses(id)) continue;
    std::span<const KvTokenId> looked_up = tokens;
    if (max_blocks) looked_up = tokens.first(std::min(tokens.size(), static_cast<size_t>((*max_blocks)[id]) * block_size_));
    KvCacheManager& member = *members_[id];
    leases[id] = mark_used ? member.lock_prefix(keys.key_in(id), looked_up) : member.hold_prefix(keys.key_in(id), looked_up);
  }
  return leases;
}

KvBlockCounts KvCacheGroup::num_blocks_needed(const RequestKvKeys& keys, const RequestLeases& leases,
                                             int32_t num_tokens) const {
  KvBlockCounts counts;
  const int32_t num_blocks = (num_tokens + block_size_ - 1) / block_size_;
  for (KvCacheId id : kAllKvCaches)
    if (keys.uses(id)) counts[id] = std::max(0, num_blocks - leases[id].num_blocks());
  return counts;
}

PerKvCache<bool> KvCacheGroup::short_members(const KvBlockCounts& counts) const {
  PerKvCache<bool> is_short;
  for (KvCacheId id : kAllKvCaches)
    if (counts[id] > 0) is_short[id] = !has(id) || !members_[id]->can_allocate(counts[id]);
  return is_short;
}

bool KvCacheGroup::can_allocate(const KvBlockCounts& counts) const {
  return !any_member(short_members(counts));
}

bool KvCacheGroup::allocate(RequestLeases& leases, const KvBlockCounts& counts) {
  if (!can_allocate(counts)) return false;
  for (KvCacheId id : kAllKvCaches) {
    LOOM_CHECK(leases[id].active() || counts[id] == 0);
    if (leases[id].active()) LOOM_CHECK(members_[id]->allocate(leases[id], counts[id]));
  }
  return true;
}

void KvCacheGroup::commit(RequestLeases& leases, std::span<const KvTokenId> tokens, int32_t num_computed_tokens) {
  for (KvCacheId id : kAllKvCaches)
    if (leases[id].active()) members_[id]->commit(leases[id], tokens, num_computed_tokens);
}

void KvCacheGroup::set_eviction_policy(KvEvictionPolicy policy) {
  for_each([&](KvCacheId, KvCacheManager& member) { member.set_eviction_policy(policy); });
}

void KvCacheGroup::set_agent_steps(const std::map<std::string, int32_t>& steps_by_agent_key) {
  for_each([&](KvCacheId, KvCacheManager& member) { member.set_agent_steps(steps_by_agent_key); });
}

void KvCacheGroup::forget_agents(const std::function<bool(const std::string&)>& matches) {
  for_each([&](KvCacheId, KvCacheManager& member) { member.forget_agents(matches); });
}

void KvCacheGroup::set_agent_fixed_prefix(const std::string& agent_key, const RequestKvKeys& keys,
                                          std::span<const KvTokenId> tokens, int32_t num_fixed_tokens) {
  for_each([&](KvCacheId id, KvCacheManager& member) {
    if (keys.uses(id)) member.set_agent_fixed_prefix(agent_key, keys.key_in(id), tokens, num_fixed_tokens);
  });
}

int32_t KvCacheGroup::drop_namespaces(const std::function<bool(const std::string&)>& matches) {
  int32_t num_freed = 0;
  for_each([&](KvCacheId, KvCacheManager& member) { num_freed += member.drop_namespaces(matches); });
  return num_freed;
}

void KvCacheGroup::set_event_sink(KvEventSink* sink) {
  for_each([&](KvCacheId id, KvCacheManager& member) { member.set_event_sink(sink, id); });
}

int32_t KvCacheGroup::evict_all_cached() {
  int32_t num_evicted = 0;
  for_each([&](KvCacheId, KvCacheManager& member) { num_evicted += member.evict_all_cached(); });
  return num_evicted;
}

void KvCacheGroup::enable_host_tier(const KvBlockCounts& num_host_blocks) {
  for_each([&](KvCacheId id, KvCacheManager& member) { member.enable_host_tier(num_host_blocks[id]); });
}

bool KvCacheGroup::has_any_host_tier() const {
  return std::any_of(kAllKvCaches.begin(), kAllKvCaches.end(), [&](KvCacheId id) { return has_host_tier(id); });
}

void KvCacheGroup::touch_prefix(const RequestKvKeys& keys, std::span<const KvTokenId> tokens) {
  LOOM_CHECK(can_hold(keys));
  for_each([&](KvCacheId id, KvCacheManager& member) {
    if (keys.uses(id)) member.touch_prefix(keys.key_in(id), tokens);
  });
}

PerKvCache<PrefixLocation> KvCacheGroup::prefix_location(const RequestKvKeys& keys, std::span<const KvTokenId> tokens,
                                                         PrefixLookup lookup) const {
  LOOM_CHECK(can_hold(keys));
  PerKvCache<PrefixLocation> location;
  for_each([&](KvCacheId id, const KvCacheManager& member) {
    if (keys.uses(id)) location[id] = member.prefix_location(keys.key_in(id), tokens, lookup);
  });
  return location;
}

void KvCacheGroup::count_late_prefetch(const RequestKvKeys& keys, std::span<const KvTokenId> tokens) {
  LOOM_CHECK(can_hold(keys));
  for_each([&](KvCacheId id, KvCacheManager& member) {
    if (keys.uses(id)) member.count_late_prefetch(keys.key_in(id), tokens);
  });
}

KvBlockCounts KvCacheGroup::start_load(const RequestKvKeys& keys, std::span<const KvTokenId> tokens,
                                       const KvBlockCounts& max_blocks, KvCacheManager::LoadReason reason) {
  LOOM_CHECK(can_hold(keys));
  KvBlockCounts num_loading;
  for_each([&](KvCacheId id, KvCacheManager& member) {
    if (keys.uses(id) && max_blocks[id] > 0 && member.host_tier() != nullptr)
      num_loading[id] = member.host_tier()->start_load(keys.key_in(id), tokens, max_blocks[id], reason);
  });
  return num_loading;
}

KvBlockCounts KvCacheGroup::start_disk_read(const RequestKvKeys& keys, std::span<const KvTokenId> tokens,
                                            int32_t max_blocks, KvCacheManager::LoadReason reason) {
  LOOM_CHECK(can_hold(keys));
  KvBlockCounts num_reading;
  for_each([&](KvCacheId id, KvCacheManager& member) {
    if (keys.uses(id) && member.disk_tier() != nullptr)
      num_reading[id] = member.disk_tier()->start_read(keys.key_in(id), tokens, max_blocks, reason);
  });
  return num_reading;
}

bool KvCacheGroup::disk_read_pending(const RequestKvKeys& keys, std::span<const KvTokenId> tokens) const {
  bool pending = false;
  for_each([&](KvCacheId id, const KvCacheManager& member) {
    pending = pending ||
              (keys.uses(id) && member.disk_tier() != nullptr && member.disk_tier()->read_pending(keys.key_in(id), tokens));
  });
  return pending;
}

bool KvCacheGroup::next_block_on_disk(const RequestKvKeys& keys, std::span<const KvTokenId> tokens) const {
  bool on_disk = false;
  for_each([&](KvCacheId id, const KvCacheManager& member) {
    on_disk = on_disk || (keys.uses(id) && member.disk_tier() != nullptr &&
                          member.disk_tier()->next_block_on_disk(keys.key_in(id), tokens));
  });
  return on_disk;
}

void KvCacheGroup::clear_reservations() {
  for_each([](KvCacheId, KvCacheManager& member) {
    if (member.disk_tier() != nullptr) member.disk_tier()->clear_reservations();
  });
}

bool KvCacheGroup::has_any_disk_tier() const {
  bool any = false;
  for_each([&](KvCacheId, const KvCacheManager& member) { any = any || member.disk_tier() != nullptr; });
  return any;
}

std::vector<KvCacheGroup::MemberTransfer> KvCacheGroup::take_transfers() {
  std::vector<MemberTransfer> transfers;
  for_each([&](KvCacheId id, KvCacheManager& member) {
    for (KvCacheManager::Transfer& transfer : member.take_transfers()) transfers.push_back({id, std::move(transfer)});
  });
  return transfers;
}

void KvCacheGroup::disk_blocks_removed(std::span<const KvBlockHash> hashes) {
  for_each([&](KvCacheId, KvCacheManager& member) {
    if (member.disk_tier() != nullptr) member.disk_tier()->blocks_removed(hashes);
  });
}

void KvCacheGroup::finish_transfer(KvCacheId cache, int64_t transfer_id, bool succeeded) {
  (*this)[cache].finish_transfer(transfer_id, succeeded);
}

int32_t KvCacheGroup::num_transfers_in_flight() const {
  int32_t num_in_flight = 0;
  for_each([&](KvCacheId, const KvCacheManager& member) { num_in_flight += member.num_transfers_in_flight(); });
  return num_in_flight;
}

PerKvCache<KvCacheStats> KvCacheGroup::stats() const {
  PerKvCache<KvCacheStats> stats;
  for_each([&](KvCacheId id, const KvCacheManager& member) { stats[id] = member.stats(); });
  return stats;
}

std::string KvCacheGroup::integrity_error() const {
  std::string problems;
  for_each([&](KvCacheId id, const KvCacheManager& member) {
    const std::string problem = member.integrity_error();
    if (problem.empty()) return;
    if (!problems.empty()) problems += "; ";
    problems += std::string(kv_cache_name(id)) + " KV cache: " + problem;
  });
  return problems;
}

}  // namespace loom
