#include "scheduler/scheduler.h"

#include <algorithm>
#include <iterator>

#include "scheduler/request_state.h"
#include "util/error.h"

namespace loom {

int32_t ScheduledBatch::num_tokens() const {
  int32_t total = 0;
  for (const auto& request : requests) total += request.num_new_tokens;
  return total;
}

Scheduler::Scheduler(SchedulerConfig config, KvCacheGroup& kv_caches) : config_(config), kv_caches_(kv_caches) {
  LOOM_CHECK(config_.max_batch_tokens > 0 && config_.max_running_requests > 0 && config_.max_loras_per_batch > 0);
}

Scheduler::~Scheduler() {
  for (auto& [id, request] : requests_) drop_swaps(*request);  // their host blocks go back to the pools
}

Scheduler::RequestState& Scheduler::state(SchedulerRequestId id) {
  auto it = requests_.find(id);
  LOOM_CHECK(it != requests_.end());
  return *it->second;
}

const Scheduler::RequestState& Scheduler::state(SchedulerRequestId id) const {
  auto it = requests_.find(id);
  LOOM_CHECK(it != requests_.end());
  return *it->second;
}

std::vector<SchedulerRequestId> Scheduler::sorted(const std::vector<SchedulerRequestId>& ids) const {
  // Rank order: lower priority value first, then earlier arrival (unique: a total order). The keys are
  // looked up once per request, not at every comparison (a map lookup each: most of a step's engine
  // time with a thousand requests waiting).
  struct Ranked {
    int32_t priority;
    int64_t arrival;
    SchedulerRequestId id;
  };
  std::vector<Ranked> ranked;
  ranked.reserve(ids.size());
  for (SchedulerRequestId id : ids) {
    const RequestState& request = state(id);
    ranked.push_back({request.priority, request.arrival, id});
  }
  std::sort(ranked.begin(), ranked.end(), [](const Ranked& a, const Ranked& b) {
    return a.priority != b.priority ? a.priority < b.priority : a.arrival < b.arrival;
  });
  std::vector<SchedulerRequestId> order;
  order.reserve(ranked.size());
  for (const Ranked& entry : ranked) order.push_back(entry.id);
  return order;
}

void Scheduler::add(SchedulerRequestId id, std::vector<int32_t> prompt_tokens, std::string adapter, RequestKvKeys kv,
                    int32_t priority) {
  LOOM_CHECK(!prompt_tokens.empty() && requests_.count(id) == 0);
  LOOM_CHECK(kv_caches_.can_hold(kv));
  auto request = std::make_unique<RequestState>();
  request->id = id;
  request->tokens = std::move(prompt_tokens);
  request->adapter = std::move(adapter);
  request->kv = std::move(kv);
  request->priority = priority;
  request->arrival = next_arrival_++;
  requests_.emplace(id, std::move(request));
  waiting_.push_back(id);
}

// schedule() and schedule_disk_reads(): scheduler_planner.cc.

ScheduledBatch Scheduler::plan(const PrefetchRequest& prefetch) {
  int32_t num_disk_read_blocks = 0;
  if (kv_caches_.has_any_disk_tier()) num_disk_read_blocks = apply(schedule_disk_reads()).num_disk_read_blocks;
  ScheduledBatch batch = apply(schedule(prefetch));
  batch.num_disk_read_blocks = num_disk_read_blocks;
  return batch;
}

ScheduledBatch Scheduler::resume_after_loads(ScheduledBatch blocked) {
  ScheduledBatch more = apply(schedule({}, &blocked));
  auto is_admitted = [&](SchedulerRequestId id) {
    return std::any_of(more.requests.begin(), more.requests.end(),
                       [&](const ScheduledRequest& entry) { return entry.id == id; });
  };
  std::erase_if(blocked.waiting_on_load, is_admitted);
  for (SchedulerRequestId id : more.waiting_on_load)
    if (std::find(blocked.waiting_on_load.begin(), blocked.waiting_on_load.end(), id) == blocked.waiting_on_load.end())
      blocked.waiting_on_load.push_back(id);
  std::move(more.requests.begin(), more.requests.end(), std::back_inserter(blocked.requests));
  blocked.blocked_on_load = std::move(more.blocked_on_load);
  return blocked;
}

// ---- apply(): the one place the step mutates queues and caches ----

void Scheduler::begin_disk_walk() {
  kv_caches_.clear_reservations();
  ++disk_walk_id_;
  is_host_budget_spent_ = false;
}

int32_t Scheduler::apply_disk_read(SchedulerRequestId id, KvBlockCounts& num_reserved) {
  RequestState& request = state(id);
  request.disk_walk_id = disk_walk_id_;
  request.is_reserved = false;
  request.waits_for_disk_read = false;
  int32_t num_reading = 0;
  for (KvCacheId member : kAllKvCaches) {
    if (!request.kv.uses(member) || kv_caches_[member].disk_tier() == nullptr) continue;
    DiskTierPlanner& disk = *kv_caches_[member].disk_tier();
    const KvKey key = request.kv.key_in(member);
    const bool is_budget_taken = num_reserved[member] > 0;  // by requests that rank before it
    const int32_t budget = kv_caches_[member].host_tier()->num_host_blocks() - num_reserved[member];
    if (budget > 0) {
      request.is_reserved = true;
      const DiskTierPlanner::PrefixReservation reservation = disk.reserve_prefix(key, request.lookup_tokens(), budget);
      num_reserved[member] += reservation.num_host_blocks + reservation.num_reading_blocks;
      if (reservation.num_unreserved_host_blocks == 0 && reservation.num_reading_blocks == 0) {
        const int32_t num_blocks =
            disk.start_read(key, request.lookup_tokens(), budget - reservation.num_host_blocks, KvLoadReason::kDemand);
        num_reserved[member] += num_blocks;
        num_reading += num_blocks;
      }
    }
    // Its turn for a read comes when those ahead are admitted (the first in line never waits for one).
    if (is_budget_taken && disk.next_block_on_disk(key, request.lookup_tokens())) request.waits_for_disk_read = true;
  }
  // The budget is spent: later requests are not looked up (schedule() does if it must).
  if (!request.is_reserved) is_host_budget_spent_ = true;
  return num_reading;
}

ScheduledBatch Scheduler::apply(const SchedulerDecision& decision) {
  // schedule() saw the cached prefixes of the requests it admits or loads for
  // as they are now: hold them until the step is applied, so that the blocks
  // allocated before them cannot evict what the step is about to reuse (the
  // ledger counted them as locked; holding adds no further cost). Sound
  // because a step that preempts admits nothing (policy 4): holding first
  // only moves the counts of admissions earlier, never past a preemption's
  // release.
  std::vector<RequestLeases> holds;
  bool any_preempted = false;
  for (const SchedulerAction& action : decision.actions) {
    const RequestState& request = state(action.id);
    any_preempted |= action.kind == SchedulerAction::Kind::kPreempt || action.kind == SchedulerAction::Kind::kSwapOut;
    if (action.kind == SchedulerAction::Kind::kAdmit)
      holds.push_back(kv_caches_.hold_prefix(request.kv, request.lookup_tokens(), action.num_found_blocks));
    else if (action.kind == SchedulerAction::Kind::kStartLoad ||  // the device parts its loads pin
             action.kind == SchedulerAction::Kind::kSwapIn)      // the committed prefix it locks
      holds.push_back(kv_caches_.hold_prefix(request.kv, request.lookup_tokens(), action.num_found_blocks));
  }
  LOOM_CHECK(!any_preempted || holds.empty());
  ScheduledBatch batch;
  if (decision.starts_disk_walk) begin_disk_walk();
  KvBlockCounts num_disk_reserved;  // policy 7, per member: host blocks reserved or being read for the walk so far
  for (const SchedulerAction& action : decision.actions) {
    RequestState& request = state(action.id);
    switch (action.kind) {
      case SchedulerAction::Kind::kReadFromDisk:
        if (!is_host_budget_spent_) batch.num_disk_read_blocks += apply_disk_read(action.id, num_disk_reserved);
        break;
      case SchedulerAction::Kind::kPreempt:
        apply_preempt(action.id, batch);
        break;
      case SchedulerAction::Kind::kRun:
        LOOM_CHECK(request.running && kv_caches_.allocate(request.leases, action.num_new_blocks));
        batch.requests.push_back(scheduled_entry(request, action.num_new_tokens));
        break;
      case SchedulerAction::Kind::kAdmit:
        apply_admit(action, batch);
        break;
      case SchedulerAction::Kind::kStartLoad: {
        const KvBlockCounts num_loading = kv_caches_.start_load(
            request.kv, request.lookup_tokens(), action.num_load_blocks, KvCacheManager::LoadReason::kDemand);
        for (KvCacheId member : kAllKvCaches)
          LOOM_CHECK((num_loading[member] > 0) == (action.num_load_blocks[member] > 0));
        batch.waiting_on_load.push_back(action.id);
        break;
      }
      case SchedulerAction::Kind::kWaitOnLoad:
        kv_caches_.count_late_prefetch(request.kv, request.lookup_tokens());
        batch.waiting_on_load.push_back(action.id);
        break;
      case SchedulerAction::Kind::kNoRoom:
        kv_caches_.touch_prefix(request.kv, request.lookup_tokens());
        break;
      case SchedulerAction::Kind::kSwapOut:
        apply_swap_out(action.id, batch);
        break;
      case SchedulerAction::Kind::kSwapIn:
        apply_swap_in(action, batch);
        break;
      case SchedulerAction::Kind::kResumeSwapped:
        apply_resume_swapped(action, batch);
        break;
      case SchedulerAction::Kind::kSwapFallback:
        apply_swap_fallback(action.id);
        break;
    }
  }
  if (decision.is_disk_walk_cut_short) is_host_budget_spent_ = true;
  batch.blocked_on_load = decision.blocked_on_load;
  apply_prefetch(decision.prefetch);
  return batch;
}

void Scheduler::apply_prefetch(const PrefetchRequest& prefetch) {
  // What a step may start: each member's pool at most, and max_bytes over all of them. An agent's
  // fixed prefix is marked in every member its requests use, so each member prefetches it.
  KvBlockCounts max_blocks;
  kv_caches_.for_each([&](KvCacheId id, const KvCacheManager& member) { max_blocks[id] = member.num_total_blocks(); });
  int64_t max_bytes = prefetch.max_bytes;
  for (size_t i = 0; i < prefetch.agent_keys.size() && max_bytes > 0; ++i) {
    kv_caches_.for_each([&](KvCacheId id, KvCacheManager& member) {
      const int64_t bytes_per_block = prefetch.bytes_per_block[id];
      const auto allowed = static_cast<int32_t>(std::min<int64_t>(max_blocks[id], max_bytes / bytes_per_block));
      const int32_t num_started = member.prefetch_agent(prefetch.agent_keys[i], allowed);
      max_blocks[id] -= num_started;
      max_bytes -= num_started * bytes_per_block;
    });
  }
}

void Scheduler::apply_preempt(SchedulerRequestId id, ScheduledBatch& batch) {
  RequestState& request = state(id);
  LOOM_CHECK(request.running);
  request.leases.release();
  request.num_computed_tokens = 0;
  request.running = false;
  running_.erase(std::find(running_.begin(), running_.end(), id));
  waiting_.push_back(id);
  ++num_preemptions_;
  if (config_.preemption_mode == PreemptionMode::kSwap) ++num_swap_fallbacks_;  // recomputes where swap was asked
  batch.preempted.push_back(id);
  auto scheduled = std::find_if(batch.requests.begin(), batch.requests.end(),
                                [&](const ScheduledRequest& entry) { return entry.id == id; });
  if (scheduled != batch.requests.end()) batch.requests.erase(scheduled);
}

void Scheduler::apply_admit(const SchedulerAction& action, ScheduledBatch& batch) {
  RequestState& request = state(action.id);
  LOOM_CHECK(!request.running);
  RequestLeases leases = kv_caches_.lock_prefix(request.kv, request.lookup_tokens(), action.num_found_blocks);
  for (KvCacheId member : kAllKvCaches) LOOM_CHECK(leases[member].num_blocks() == action.num_found_blocks[member]);
  LOOM_CHECK(leases.num_found_tokens() == action.num_computed_tokens);
  LOOM_CHECK(kv_caches_.allocate(leases, action.num_new_blocks));
  request.leases = std::move(leases);
  request.num_computed_tokens = action.num_computed_tokens;
  request.running = true;
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), action.id));
  running_.push_back(action.id);
  ScheduledRequest entry = scheduled_entry(request, action.num_new_tokens);
  entry.num_prefix_hit_tokens = request.was_admitted ? -1 : action.num_computed_tokens;
  request.was_admitted = true;
  batch.requests.push_back(std::move(entry));
}

ScheduledRequest Scheduler::scheduled_entry(const RequestState& request, int32_t num_new_tokens) const {
  ScheduledRequest entry;
  entry.id = request.id;
  entry.num_computed_tokens = request.num_computed_tokens;
  entry.num_new_tokens = num_new_tokens;
  entry.block_ids = request.leases[KvCacheId::kMain].block_ids();
  entry.num_kv_present_tokens = request.num_present_tokens(KvCacheId::kMain);
  if (request.is_forked()) {
    entry.residual_block_ids = request.leases[KvCacheId::kResidual].block_ids();
    entry.num_residual_present_tokens = request.num_present_tokens(KvCacheId::kResidual);
  }
  entry.samples_next_token = request.num_computed_tokens + num_new_tokens == static_cast<int32_t>(request.tokens.size());
  return entry;
}

void Scheduler::complete_step(const ScheduledBatch& batch) {
  for (const ScheduledRequest& entry : batch.requests) {
    auto it = requests_.find(entry.id);
    if (it == requests_.end()) continue;
    RequestState& request = *it->second;
    LOOM_CHECK(request.running && request.num_computed_tokens == entry.num_computed_tokens);
    request.num_computed_tokens += entry.num_new_tokens;
    kv_caches_.commit(request.leases, request.tokens, request.num_computed_tokens);
  }
}

void Scheduler::append_token(SchedulerRequestId id, int32_t token) { state(id).tokens.push_back(token); }

bool Scheduler::finish(SchedulerRequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  drop_swaps(*it->second);
  it->second->leases.release();
  auto& queue = it->second->running ? running_ : waiting_;
  queue.erase(std::find(queue.begin(), queue.end(), id));
  requests_.erase(it);
  return true;
}

bool Scheduler::contains(SchedulerRequestId id) const { return requests_.count(id) != 0; }
const std::vector<int32_t>& Scheduler::tokens(SchedulerRequestId id) const { return state(id).tokens; }
int32_t Scheduler::num_computed_tokens(SchedulerRequestId id) const { return state(id).num_computed_tokens; }
bool Scheduler::is_running(SchedulerRequestId id) const { return state(id).running; }

}  // namespace loom
