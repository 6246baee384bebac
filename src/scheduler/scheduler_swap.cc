// Swap preemption's apply() steps (scheduler.h policies 4 under
// PreemptionMode::kSwap and 9); the planning is in scheduler.cc's Planner.
#include <algorithm>

#include "scheduler/request_state.h"
#include "scheduler/scheduler.h"
#include "util/error.h"

namespace loom {

namespace {

HostSwapSpace& swap_space(KvCacheGroup& kv_caches, KvCacheId member) {
  HostTierPlanner* host = kv_caches[member].host_tier();
  LOOM_CHECK(host != nullptr);
  return host->swap_space();
}

}  // namespace

bool Scheduler::can_swap_out(const RequestState& request) const {
  if (config_.preemption_mode != PreemptionMode::kSwap) return false;
  for (KvCacheId member : kAllKvCaches)
    if (request.kv.uses(member) && !kv_caches_.has_host_tier(member)) return false;
  return true;
}

int32_t Scheduler::num_swapped() const {
  int32_t count = 0;
  for (SchedulerRequestId id : waiting_) count += state(id).swapped ? 1 : 0;
  return count;
}

void Scheduler::apply_swap_out(SchedulerRequestId id, ScheduledBatch& batch) {
  RequestState& request = state(id);
  LOOM_CHECK(request.running && !request.swapped && can_swap_out(request));
  SwappedKv swapped;
  bool is_taken = true;
  for (KvCacheId member : kAllKvCaches) {
    if (!request.kv.uses(member)) continue;
    const auto [begin, end] = request.private_data_blocks(member, kv_caches_.block_size());
    const std::vector<int32_t>& blocks = request.leases[member].block_ids();
    const std::optional<int64_t> swap_id = swap_space(kv_caches_, member)
                                               .swap_out(std::span<const int32_t>(blocks).subspan(
                                                   static_cast<size_t>(begin), static_cast<size_t>(end - begin)));
    if (!swap_id) {
      is_taken = false;
      break;
    }
    swapped.swap_ids[member] = *swap_id;
    swapped.num_committed_blocks[member] = request.leases[member].num_committed_blocks();
  }
  if (!is_taken) {  // the host tier cannot take it: recompute (the copies started are dropped)
    request.swapped = std::move(swapped);
    drop_swaps(request);
    apply_preempt(id, batch);  // counts the fallback
    return;
  }
  request.leases.release();  // committed blocks: cached; private ones: pinned by their copies
  request.swapped = std::move(swapped);
  request.running = false;
  running_.erase(std::find(running_.begin(), running_.end(), id));
  waiting_.push_back(id);
  ++num_preemptions_;
  ++num_swap_preemptions_;
  batch.preempted.push_back(id);
  auto scheduled = std::find_if(batch.requests.begin(), batch.requests.end(),
                                [&](const ScheduledRequest& entry) { return entry.id == id; });
  if (scheduled != batch.requests.end()) batch.requests.erase(scheduled);
}

void Scheduler::apply_swap_in(const SchedulerAction& action, ScheduledBatch& batch) {
  RequestState& request = state(action.id);
  LOOM_CHECK(!request.running && request.swapped && !request.swapped->is_swapping_in);
  RequestLeases leases = kv_caches_.lock_prefix(request.kv, request.lookup_tokens(), action.num_found_blocks);
  for (KvCacheId member : kAllKvCaches) LOOM_CHECK(leases[member].num_blocks() == action.num_found_blocks[member]);
  LOOM_CHECK(kv_caches_.allocate(leases, action.num_new_blocks));
  bool any_copy = false;
  for (KvCacheId member : kAllKvCaches) {
    if (!request.kv.uses(member)) continue;
    HostSwapSpace& swaps = swap_space(kv_caches_, member);
    const int64_t swap_id = request.swapped->swap_ids[member];
    const auto num_blocks = static_cast<size_t>(swaps.num_blocks(swap_id));
    const std::vector<int32_t>& blocks = leases[member].block_ids();
    LOOM_CHECK(blocks.size() >= static_cast<size_t>(action.num_found_blocks[member]) + num_blocks);
    swaps.swap_in(swap_id, std::span<const int32_t>(blocks).subspan(
                               static_cast<size_t>(action.num_found_blocks[member]), num_blocks));
    any_copy |= num_blocks > 0;
  }
  request.leases = std::move(leases);
  request.swapped->is_swapping_in = true;
  if (any_copy) batch.waiting_on_load.push_back(action.id);
}

void Scheduler::apply_resume_swapped(const SchedulerAction& action, ScheduledBatch& batch) {
  RequestState& request = state(action.id);
  LOOM_CHECK(!request.running && request.swapped && request.swapped->is_swapping_in);
  for (KvCacheId member : kAllKvCaches)
    if (request.kv.uses(member))
      LOOM_CHECK(swap_space(kv_caches_, member).state(request.swapped->swap_ids[member]) ==
                 HostSwapSpace::State::kOnDevice);
  drop_swaps(request);
  LOOM_CHECK(kv_caches_.allocate(request.leases, action.num_new_blocks));
  request.running = true;
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), action.id));
  running_.push_back(action.id);
  batch.requests.push_back(scheduled_entry(request, action.num_new_tokens));
}

void Scheduler::apply_swap_fallback(SchedulerRequestId id) {
  RequestState& request = state(id);
  LOOM_CHECK(!request.running && request.swapped);
  drop_swaps(request);
  request.leases.release();
  request.num_computed_tokens = 0;
  ++num_swap_fallbacks_;
}

void Scheduler::drop_swaps(RequestState& request) {
  if (!request.swapped) return;
  for (KvCacheId member : kAllKvCaches)
    if (request.swapped->swap_ids[member] != 0) swap_space(kv_caches_, member).drop(request.swapped->swap_ids[member]);
  request.swapped.reset();
}

}  // namespace loom
