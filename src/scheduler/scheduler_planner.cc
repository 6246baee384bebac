// Scheduler::schedule() and schedule_disk_reads(): the policy (scheduler.h,
// policies 1-9), decided on counts by the Planner over a KvCapacityLedger and
// returned as a SchedulerDecision; nothing changes until apply() (scheduler.cc).
#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "kv/kv_capacity_ledger.h"
#include "scheduler/request_state.h"
#include "scheduler/scheduler.h"
#include "util/error.h"

namespace loom {

// ---- schedule(): the policy, on counts ----

class Scheduler::Planner {
 public:
  // `blocked`: plan the rest of that step (admissions only, from what it left).
  Planner(const Scheduler& scheduler, const ScheduledBatch* blocked)
      : scheduler_(scheduler), kv_caches_(scheduler.kv_caches_), ledger_(scheduler.kv_caches_),
        budget_(scheduler.config_.max_batch_tokens - (blocked ? blocked->num_tokens() : 0)),
        is_resuming_(blocked != nullptr),
        is_blocking_(scheduler.config_.host_load_policy == HostLoadPolicy::kBlocking) {
    LOOM_CHECK(budget_ >= 0);
  }

  SchedulerDecision run() {
    if (!is_resuming_) plan_running();
    if (preempted_.empty()) plan_admissions();
    return std::move(decision_);
  }

 private:
  // Policy 1, 2 and 4: running requests, decodes first, each growing by what the budget allows.
  void plan_running() {
    std::vector<SchedulerRequestId> order;
    const std::vector<SchedulerRequestId> ranked = scheduler_.sorted(scheduler_.running_);
    for (bool decodes : {true, false})
      for (SchedulerRequestId id : ranked)
        if ((num_uncomputed(scheduler_.state(id)) == 1) == decodes) order.push_back(id);
    for (SchedulerRequestId id : order) {
      if (budget_ == 0) break;
      if (preempted_.count(id)) continue;
      const RequestState& request = scheduler_.state(id);
      LOOM_CHECK(num_uncomputed(request) > 0);
      const int32_t num_new = std::min(num_uncomputed(request), budget_);
      const KvBlockCounts num_blocks =
          kv_caches_.num_blocks_needed(request.kv, request.leases, request.num_computed_tokens + num_new);
      if (!make_room(id, num_blocks)) continue;
      ledger_.take(num_blocks);
      new_blocks_[id] = num_blocks;
      new_tokens_[id] = num_new;
      budget_ -= num_new;
      decision_.actions.push_back(SchedulerAction::run(id, num_new, num_blocks));
    }
  }

  // Preempts the worst-ranked running requests until `num_blocks` can be had;
  // false when the request itself was the victim.
  bool make_room(SchedulerRequestId id, const KvBlockCounts& num_blocks) {
    for (;;) {
      const PerKvCache<bool> is_short = ledger_.short_members(num_blocks);
      if (!any_member(is_short)) return true;
      const SchedulerRequestId victim = choose_victim(is_short[KvCacheId::kMain]);
      preempt(victim);
      if (victim == id) return false;
    }
  }

  // Preempting a request that holds no rCache cannot help a short residual pool,
  // so then the victim is the worst-ranked forked request (the asking one at worst).
  SchedulerRequestId choose_victim(bool is_main_short) const {
    const std::vector<SchedulerRequestId> order = scheduler_.sorted(scheduler_.running_);
    for (auto it = order.rbegin(); it != order.rend(); ++it)
      if (!preempted_.count(*it) && (is_main_short || scheduler_.state(*it).is_forked())) return *it;
    LOOM_CHECK(false);
    return order.back();
  }

  void preempt(SchedulerRequestId id) {
    const RequestState& request = scheduler_.state(id);
    const bool swaps = scheduler_.can_swap_out(request);
    for (KvCacheId member : kAllKvCaches) {
      if (!request.kv.uses(member)) continue;
      std::span<const int32_t> blocks = request.leases[member].block_ids();
      if (!swaps) {
        ledger_.drop_refs(member, blocks);
        continue;
      }
      // Swap: the private blocks with data stay referenced (their copies pin them) until the copy lands.
      const auto [begin, end] = request.private_data_blocks(member, kv_caches_.block_size());
      ledger_.drop_refs(member, blocks.first(static_cast<size_t>(begin)));
      ledger_.drop_refs(member, blocks.subspan(static_cast<size_t>(end)));
    }
    if (auto it = new_blocks_.find(id); it != new_blocks_.end()) {  // scheduled earlier in this step
      ledger_.give_back(it->second);
      budget_ += new_tokens_.at(id);
    }
    preempted_.insert(id);
    decision_.actions.push_back(swaps ? SchedulerAction::swap_out(id) : SchedulerAction::preempt(id));
  }

  // Policy 1, 2, 3, 5 and 6: waiting requests in rank order.
  void plan_admissions() {
    int32_t num_running = scheduler_.num_running();
    // Nothing to admit: skip ranking the waiting queue (an agent fan-out can leave a thousand there).
    if (budget_ == 0 || num_running >= scheduler_.config_.max_running_requests) return;
    std::set<std::string> adapters;
    for (SchedulerRequestId id : scheduler_.running_)
      if (!scheduler_.state(id).adapter.empty()) adapters.insert(scheduler_.state(id).adapter);
    // Policy 9: swapped requests first (rank order among them), then the others.
    std::vector<SchedulerRequestId> order = scheduler_.sorted(scheduler_.waiting_);
    std::stable_partition(order.begin(), order.end(),
                          [&](SchedulerRequestId id) { return scheduler_.state(id).swapped.has_value(); });
    for (SchedulerRequestId id : order) {
      if (budget_ == 0 || num_running >= scheduler_.config_.max_running_requests) break;
      const RequestState& request = scheduler_.state(id);
      if (!request.adapter.empty() && adapters.count(request.adapter) == 0 &&
          static_cast<int32_t>(adapters.size()) >= scheduler_.config_.max_loras_per_batch)
        continue;
      if (request.swapped) {
        const SwapStep step = plan_swapped(request);
        if (step == SwapStep::kBlocked) {
          decision_.blocked_on_load.push_back(id);
          break;
        }
        if (step == SwapStep::kNoRoom) {
          decision_.actions.push_back(SchedulerAction::no_room(id));
          break;
        }
        if (step == SwapStep::kResumed) {
          ++num_running;
          if (!request.adapter.empty()) adapters.insert(request.adapter);
        }
        continue;
      }
      if (kv_caches_.has_any_host_tier()) {
        const LoadWait wait = waits_on_load(request);
        if (wait == LoadWait::kHostLoad && is_blocking_) {  // it holds its place; the step waits for its load
          decision_.blocked_on_load.push_back(id);
          break;
        }
        if (wait != LoadWait::kNone) continue;  // status-aware: later requests pass it
      }
      if (!admit(request)) {
        decision_.actions.push_back(SchedulerAction::no_room(id));
        break;
      }
      ++num_running;
      if (!request.adapter.empty()) adapters.insert(request.adapter);
    }
  }

  // Policy 9 for a swapped request; adds its actions (not kNoRoom's).
  enum class SwapStep : uint8_t { kResumed, kWaits, kBlocked, kNoRoom };
  SwapStep plan_swapped(const RequestState& request) {
    const SwappedKv& swapped = *request.swapped;
    const SwapStep waits = is_blocking_ ? SwapStep::kBlocked : SwapStep::kWaits;
    bool is_copying = false;
    for (KvCacheId member : kAllKvCaches) {
      if (!request.kv.uses(member)) continue;
      const HostSwapSpace::State state = kv_caches_[member].host_tier()->swap_space().state(swapped.swap_ids[member]);
      if (state == HostSwapSpace::State::kLost) return fall_back(request);
      is_copying |= state == HostSwapSpace::State::kSwappingOut || state == HostSwapSpace::State::kSwappingIn;
    }
    if (is_copying) {
      decision_.actions.push_back(SchedulerAction::wait_on_load(request.id));
      return waits;
    }
    if (swapped.is_swapping_in) return resume(request, kv_caches_.num_blocks_needed(request.kv, request.leases,
                                                                                     num_resumed_tokens(request)));
    // Its committed prefix, back on the device in every member (loaded from the host as in policy 6).
    PerKvCache<std::vector<int32_t>> device_blocks;
    bool needs_load = false;
    for (KvCacheId member : kAllKvCaches) {
      if (!request.kv.uses(member)) continue;
      const int32_t num_committed = swapped.num_committed_blocks[member];
      const PrefixLocation location = kv_caches_[member].prefix_location(
          request.kv.key_in(member), request.lookup_tokens(), PrefixLookup::kTree);
      if (location.num_device_blocks() >= num_committed) {
        device_blocks[member].assign(location.device_block_ids.begin(),
                                     location.device_block_ids.begin() + num_committed);
        continue;
      }
      if (location.num_device_blocks() + location.num_loading_blocks + location.num_host_blocks() < num_committed)
        return fall_back(request);  // part of it left every tier
      needs_load = true;
    }
    if (needs_load) {
      const LoadWait wait = waits_on_load(request);
      if (wait == LoadWait::kHostLoad) return waits;
      if (wait == LoadWait::kOther) return SwapStep::kWaits;
      return room_will_come() || num_admitted_ > 0 ? SwapStep::kNoRoom : fall_back(request);
    }
    // Swap in: lock the committed prefix, take blocks for every token (policy 9).
    KvBlockCounts num_found, num_new;
    const int32_t num_blocks_after =
        (static_cast<int32_t>(request.tokens.size()) + kv_caches_.block_size() - 1) / kv_caches_.block_size();
    bool any_copy = false;
    for (KvCacheId member : kAllKvCaches) {
      if (!request.kv.uses(member)) continue;
      ledger_.add_refs(member, device_blocks[member]);
      num_found[member] = swapped.num_committed_blocks[member];
      num_new[member] = std::max(0, num_blocks_after - num_found[member]);
      any_copy |= kv_caches_[member].host_tier()->swap_space().num_blocks(swapped.swap_ids[member]) > 0;
    }
    if (!ledger_.can_allocate(num_new)) {
      for (KvCacheId member : kAllKvCaches) ledger_.drop_refs(member, device_blocks[member]);
      return SwapStep::kNoRoom;
    }
    ledger_.take(num_new);
    decision_.actions.push_back(SchedulerAction::swap_in(request.id, num_found, num_new));
    if (any_copy) return waits;
    return resume(request, KvBlockCounts{});  // nothing to copy: it resumes now
  }

  SwapStep resume(const RequestState& request, const KvBlockCounts& num_blocks) {
    if (!ledger_.can_allocate(num_blocks)) return SwapStep::kNoRoom;
    ledger_.take(num_blocks);
    const int32_t num_new = num_resumed_tokens(request) - request.num_computed_tokens;
    budget_ -= num_new;
    ++num_admitted_;
    decision_.actions.push_back(SchedulerAction::resume_swapped(request.id, num_new, num_blocks));
    return SwapStep::kResumed;
  }
  // Where a resumed request's step ends: its uncomputed tokens, as far as the budget allows.
  int32_t num_resumed_tokens(const RequestState& request) const {
    return request.num_computed_tokens + std::min(num_uncomputed(request), budget_);
  }
  SwapStep fall_back(const RequestState& request) {
    decision_.actions.push_back(SchedulerAction::swap_fallback(request.id));
    return SwapStep::kWaits;
  }

  // kHostLoad: its prefix is loading from the host, or it starts the load; kOther: it
  // waits for something else (a disk read, its turn for one, room).
  enum class LoadWait : uint8_t { kNone, kHostLoad, kOther };

  // Policy 6. Adds the kWaitOnLoad / kStartLoad action when the request waits.
  LoadWait waits_on_load(const RequestState& request) {
    // Each member's prefix is [device ...][loading ...][host ...] (kv/prefix_location.h).
    PerKvCache<PrefixLocation> locations;
    for (KvCacheId member : kAllKvCaches) {
      if (!request.kv.uses(member) || !kv_caches_.has_host_tier(member)) continue;
      locations[member] =
          kv_caches_[member].prefix_location(request.kv.key_in(member), request.lookup_tokens(), PrefixLookup::kTree);
      if (ledger_.is_loading(member, locations[member])) {
        decision_.actions.push_back(SchedulerAction::wait_on_load(request.id));
        return LoadWait::kHostLoad;
      }
    }
    // A demand load pins the device part of its member's prefix, then takes the blocks it can get there.
    KvBlockCounts num_pinned, num_load;
    bool any_load = false, any_host = false;
    for (KvCacheId member : kAllKvCaches) {
      const PrefixLocation& location = locations[member];
      if (location.host_block_ids.empty()) continue;
      const std::vector<int32_t>& device_blocks = location.device_block_ids;
      ledger_.add_refs(member, device_blocks);
      any_host = true;
      // Leave the blocks reserved for other waiting requests alone while room will come otherwise.
      const int32_t num_unreserved = ledger_.num_unreserved_available_blocks(member);
      const int32_t room =
          num_unreserved > 0 || room_will_come() ? num_unreserved : ledger_.num_available_blocks(member);
      const int32_t num_loading = std::min(location.num_host_blocks(), room);
      if (num_loading <= 0) {  // no room here: this member recomputes what is on its host, or waits (below)
        ledger_.drop_refs(member, device_blocks);
        continue;
      }
      KvBlockCounts num_blocks;
      num_blocks[member] = num_loading;
      ledger_.take(num_blocks);
      for (int32_t i = 0; i < num_loading; ++i)
        ledger_.mark_loading(member, location.host_block_ids[static_cast<size_t>(i)]);
      num_pinned[member] = location.num_device_blocks();
      num_load[member] = num_loading;
      any_load = true;
      ++num_loads_;
    }
    if (!any_load) {
      // No room to load (or nothing on the host): admit with the device prefixes, unless a disk read
      // is coming, its turn for one is (policy 7), or it is reserved and room will come.
      const bool waits = kv_caches_.disk_read_pending(request.kv, request.lookup_tokens()) ||
                         waits_for_disk_read(request) || (any_host && is_reserved(request) && room_will_come());
      if (!waits) return LoadWait::kNone;
      decision_.actions.push_back(SchedulerAction::wait_on_load(request.id));
      return LoadWait::kOther;
    }
    decision_.actions.push_back(SchedulerAction::start_load(request.id, num_pinned, num_load));
    return LoadWait::kHostLoad;
  }

  // Locks the request's cached prefix in every member it uses and gives it
  // its blocks; false (nothing counted) when they cannot be had.
  bool admit(const RequestState& request) {
    PerKvCache<std::vector<int32_t>> found_blocks;
    PerKvCache<bool> is_trimmed;
    for (KvCacheId member : kAllKvCaches) {
      if (!request.kv.uses(member)) continue;
      found_blocks[member] = kv_caches_[member]
                                 .prefix_location(request.kv.key_in(member), request.lookup_tokens(), PrefixLookup::kTree)
                                 .device_block_ids;
      ledger_.add_refs(member, found_blocks[member]);
      // Below zero, this step's earlier allocations needed some of these cached
      // blocks: the request does without the last ones (unreferenced, so the tail of the path).
      while (ledger_.num_available_blocks(member) < 0 && !found_blocks[member].empty()) {
        drop_last_found_block(member, found_blocks[member]);
        is_trimmed[member] = true;
      }
    }
    for (;;) {
      // The members evict independently: compute from the shorter hit, write only what is missing.
      int32_t num_computed = std::numeric_limits<int32_t>::max();
      for (KvCacheId member : kAllKvCaches)
        if (request.kv.uses(member))
          num_computed = std::min(num_computed, static_cast<int32_t>(found_blocks[member].size()) * kv_caches_.block_size());
      const int32_t num_new = std::min(static_cast<int32_t>(request.tokens.size()) - num_computed, budget_);
      const int32_t num_blocks_after = (num_computed + num_new + kv_caches_.block_size() - 1) / kv_caches_.block_size();
      KvBlockCounts num_blocks, num_found_blocks;
      for (KvCacheId member : kAllKvCaches) {
        if (!request.kv.uses(member)) continue;
        num_found_blocks[member] = static_cast<int32_t>(found_blocks[member].size());
        num_blocks[member] = std::max(0, num_blocks_after - num_found_blocks[member]);
      }
      const PerKvCache<bool> is_short = ledger_.short_members(num_blocks);
      if (!any_member(is_short)) {
        ledger_.take(num_blocks);
        budget_ -= num_new;
        ++num_admitted_;
        decision_.actions.push_back(
            SchedulerAction::admit(request.id, num_new, num_computed, num_blocks, num_found_blocks));
        return true;
      }
      // A member that had to give up part of the prefix may give up more: a
      // shorter hit with a budget-limited chunk needs fewer blocks.
      std::optional<KvCacheId> trim;
      for (KvCacheId member : kAllKvCaches)
        if (is_short[member] && is_trimmed[member] && !found_blocks[member].empty()) trim = member;
      if (!trim) break;
      drop_last_found_block(*trim, found_blocks[*trim]);
    }
    for (KvCacheId member : kAllKvCaches) ledger_.drop_refs(member, found_blocks[member]);
    return false;
  }

  // Policy 7's marks, as the disk walk left them this step. A request it
  // did not reach (arrived since, or past the spent host budget) waits for its
  // turn when the budget was spent and its next block is on disk.
  bool is_reserved(const RequestState& request) const {
    return request.disk_walk_id == scheduler_.disk_walk_id_ && request.is_reserved;
  }
  bool waits_for_disk_read(const RequestState& request) const {
    if (request.disk_walk_id == scheduler_.disk_walk_id_) return request.waits_for_disk_read;
    return scheduler_.is_host_budget_spent_ && kv_caches_.next_block_on_disk(request.kv, request.lookup_tokens());
  }
  // Whether device room comes back without admitting anything: a running request will finish
  // (or be preempted), or a transfer in flight or planned will release its pins.
  bool room_will_come() const {
    return scheduler_.running_.size() > preempted_.size() || kv_caches_.num_transfers_in_flight() > 0 ||
           num_loads_ > 0;
  }

  void drop_last_found_block(KvCacheId member, std::vector<int32_t>& found_blocks) {
    ledger_.drop_refs(member, std::span<const int32_t>(&found_blocks.back(), 1));
    found_blocks.pop_back();
  }


  static int32_t num_uncomputed(const RequestState& request) {
    return static_cast<int32_t>(request.tokens.size()) - request.num_computed_tokens;
  }

  const Scheduler& scheduler_;
  const KvCacheGroup& kv_caches_;
  KvCapacityLedger ledger_;
  int32_t budget_;
  SchedulerDecision decision_;
  std::set<SchedulerRequestId> preempted_;
  std::map<SchedulerRequestId, KvBlockCounts> new_blocks_;  // kRun actions of this step
  std::map<SchedulerRequestId, int32_t> new_tokens_;
  int32_t num_loads_ = 0;  // kStartLoad actions of this step
  int32_t num_admitted_ = 0;  // kAdmit and kResumeSwapped actions of this step (they will run, then give room back)
  const bool is_resuming_;
  const bool is_blocking_;
};

SchedulerDecision Scheduler::schedule(const PrefetchRequest& prefetch, const ScheduledBatch* blocked) const {
  LOOM_CHECK(blocked == nullptr || !blocked->blocked_on_load.empty());
  SchedulerDecision decision = Planner(*this, blocked).run();
  if (kv_caches_.has_any_host_tier() && blocked == nullptr) decision.prefetch = prefetch;
  return decision;
}

SchedulerDecision Scheduler::schedule_disk_reads() const {
  SchedulerDecision decision;
  if (!kv_caches_.has_any_disk_tier()) return decision;
  decision.starts_disk_walk = true;
  const std::vector<SchedulerRequestId> order = sorted(waiting_);
  for (SchedulerRequestId id : order) {
    // Bounded work per step: the rest are treated as past the budget.
    if (static_cast<int32_t>(decision.actions.size()) == kMaxDiskReadWalk) {
      decision.is_disk_walk_cut_short = true;
      break;
    }
    decision.actions.push_back(SchedulerAction::read_from_disk(id));
  }
  return decision;
}

}  // namespace loom
