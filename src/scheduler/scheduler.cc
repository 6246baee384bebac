#include "scheduler/scheduler.h"

#include <algorithm>
#include <set>

#include "util/error.h"

namespace loom {

struct Scheduler::RequestState {
  SchedulerRequestId id = 0;
  std::vector<int32_t> tokens;
  std::string adapter;
  RequestKvKeys kv;
  int32_t priority = 0;
  int64_t arrival = 0;
  int32_t num_computed_tokens = 0;
  bool was_admitted = false;
  bool running = false;
  KvLease lease;
  KvLease residual_lease;  // forked only
  // Entries found in each cache at admission (a forked partial hit may find
  // more than it computes from); what the backend must not write is
  // max(this, num_computed_tokens).
  int32_t num_kv_found_tokens = 0;
  int32_t num_residual_found_tokens = 0;

  bool is_forked() const { return !kv.residual_namespace.empty(); }
  int32_t num_kv_present_tokens() const { return std::max(num_kv_found_tokens, num_computed_tokens); }
  int32_t num_residual_present_tokens() const {
    return is_forked() ? std::max(num_residual_found_tokens, num_computed_tokens) : 0;
  }
};

int32_t ScheduledBatch::num_tokens() const {
  int32_t total = 0;
  for (const auto& request : requests) total += request.num_new_tokens;
  return total;
}

Scheduler::Scheduler(SchedulerConfig config, KvCacheGroup& kv_caches)
    : config_(config), kv_caches_(kv_caches), kv_cache_(kv_caches.main()), residual_cache_(kv_caches.residual()) {
  LOOM_CHECK(config_.max_batch_tokens > 0 && config_.max_running_requests > 0 && config_.max_loras_per_batch > 0);
}

Scheduler::~Scheduler() = default;

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

bool Scheduler::ranks_before(const RequestState& a, const RequestState& b) const {
  return a.priority != b.priority ? a.priority < b.priority : a.arrival < b.arrival;
}

std::vector<SchedulerRequestId> Scheduler::sorted(const std::vector<SchedulerRequestId>& ids) const {
  std::vector<SchedulerRequestId> order = ids;
  std::sort(order.begin(), order.end(),
            [&](SchedulerRequestId a, SchedulerRequestId b) { return ranks_before(state(a), state(b)); });
  return order;
}

int32_t Scheduler::num_blocks_for(int32_t num_tokens) const {
  return (num_tokens + kv_cache_.block_size() - 1) / kv_cache_.block_size();
}

int32_t Scheduler::num_residual_blocks_for(int32_t num_tokens) const {
  return (num_tokens + residual_cache_->block_size() - 1) / residual_cache_->block_size();
}

void Scheduler::add(SchedulerRequestId id, std::vector<int32_t> prompt_tokens, std::string adapter,
                    RequestKvKeys kv, int32_t priority) {
  LOOM_CHECK(!prompt_tokens.empty() && requests_.count(id) == 0);
  LOOM_CHECK(kv.residual_namespace.empty() || residual_cache_ != nullptr);
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

void Scheduler::preempt(SchedulerRequestId id, ScheduledBatch& plan, int32_t& budget) {
  RequestState& request = state(id);
  LOOM_CHECK(request.running);
  request.lease.release();
  request.residual_lease.release();
  request.num_computed_tokens = 0;
  request.num_kv_found_tokens = 0;
  request.num_residual_found_tokens = 0;
  request.running = false;
  running_.erase(std::find(running_.begin(), running_.end(), id));
  waiting_.push_back(id);
  ++num_preemptions_;
  plan.preempted.push_back(id);
  auto scheduled = std::find_if(plan.requests.begin(), plan.requests.end(),
                                [&](const ScheduledRequest& entry) { return entry.id == id; });
  if (scheduled != plan.requests.end()) {
    budget += scheduled->num_new_tokens;
    plan.requests.erase(scheduled);
  }
}

// Preempting a request that holds no rCache cannot help a short residual pool,
// so then the victim is the worst-ranked forked request (the asking one at worst).
SchedulerRequestId Scheduler::choose_victim(bool is_main_short) const {
  const std::vector<SchedulerRequestId> order = sorted(running_);
  for (auto it = order.rbegin(); it != order.rend(); ++it)
    if (is_main_short || state(*it).is_forked()) return *it;
  LOOM_CHECK(false);
  return order.back();
}

ScheduledRequest Scheduler::scheduled_entry(const RequestState& request, int32_t num_new_tokens,
                                            int32_t num_uncomputed_tokens) const {
  ScheduledRequest entry;
  entry.id = request.id;
  entry.num_computed_tokens = request.num_computed_tokens;
  entry.num_new_tokens = num_new_tokens;
  entry.block_ids = request.lease.block_ids();
  entry.num_kv_present_tokens = request.num_kv_present_tokens();
  if (request.is_forked()) {
    entry.residual_block_ids = request.residual_lease.block_ids();
    entry.num_residual_present_tokens = request.num_residual_present_tokens();
  }
  entry.samples_next_token = num_new_tokens == num_uncomputed_tokens;
  return entry;
}

ScheduledBatch Scheduler::plan() {
  ScheduledBatch plan;
  int32_t budget = config_.max_batch_tokens;

  // 1. Running requests: decodes first, then prefill chunks.
  std::vector<SchedulerRequestId> order;
  for (SchedulerRequestId id : sorted(running_)) {
    const RequestState& request = state(id);
    if (static_cast<int32_t>(request.tokens.size()) - request.num_computed_tokens == 1) order.push_back(id);
  }
  for (SchedulerRequestId id : sorted(running_)) {
    const RequestState& request = state(id);
    if (static_cast<int32_t>(request.tokens.size()) - request.num_computed_tokens != 1) order.push_back(id);
  }
  for (SchedulerRequestId id : order) {
    if (budget == 0) break;
    RequestState& request = state(id);
    if (!request.running) continue;  // preempted earlier in this step
    const int32_t num_uncomputed = static_cast<int32_t>(request.tokens.size()) - request.num_computed_tokens;
    LOOM_CHECK(num_uncomputed > 0);
    const int32_t num_new = std::min(num_uncomputed, budget);
    const int32_t num_tokens_after = request.num_computed_tokens + num_new;
    const int32_t num_needed = std::max(0, num_blocks_for(num_tokens_after) - request.lease.num_blocks());
    const int32_t num_residual_needed =
        request.is_forked() ? std::max(0, num_residual_blocks_for(num_tokens_after) - request.residual_lease.num_blocks())
                            : 0;
    bool preempted_self = false;
    for (;;) {
      const bool is_main_short = !kv_cache_.can_allocate(num_needed);
      const bool is_residual_short = num_residual_needed > 0 && !residual_cache_->can_allocate(num_residual_needed);
      if (!is_main_short && !is_residual_short) break;
      const SchedulerRequestId victim = choose_victim(is_main_short);
      preempt(victim, plan, budget);
      if (victim == id) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) continue;
    LOOM_CHECK(kv_cache_.allocate(request.lease, num_needed));
    if (request.is_forked()) LOOM_CHECK(residual_cache_->allocate(request.residual_lease, num_residual_needed));
    plan.requests.push_back(scheduled_entry(request, num_new, num_uncomputed));
    budget -= num_new;
  }
  if (!plan.preempted.empty()) return plan;

  // 2. Admit waiting requests.
  std::set<std::string> adapters;
  for (SchedulerRequestId id : running_)
    if (!state(id).adapter.empty()) adapters.insert(state(id).adapter);
  for (SchedulerRequestId id : sorted(waiting_)) {
    if (budget == 0 || num_running() >= config_.max_running_requests) break;
    RequestState& request = state(id);
    if (!request.adapter.empty() && adapters.count(request.adapter) == 0 &&
        static_cast<int32_t>(adapters.size()) >= config_.max_loras_per_batch)
      continue;
    // At least one token must be computed to get logits, so the last token never comes from the cache.
    std::span<const int32_t> all_tokens(request.tokens);
    const std::span<const int32_t> lookup_tokens = all_tokens.first(all_tokens.size() - 1);
    if (kv_cache_.has_host_tier() && is_waiting_on_load(request, lookup_tokens)) {
      plan.waiting_on_load.push_back(id);
      continue;
    }
    KvLease lease = kv_cache_.lock_prefix(request.kv.key, lookup_tokens);
    KvLease residual_lease;
    int32_t num_computed = lease.num_found_tokens();
    if (request.is_forked()) {
      // The trees evict independently: compute from the shorter hit, write only what is missing.
      residual_lease = residual_cache_->lock_prefix(KvKey::single(request.kv.residual_namespace), lookup_tokens);
      num_computed = std::min(num_computed, residual_lease.num_found_tokens());
    }
    const int32_t num_uncomputed = static_cast<int32_t>(request.tokens.size()) - num_computed;
    const int32_t num_new = std::min(num_uncomputed, budget);
    const int32_t num_needed = std::max(0, num_blocks_for(num_computed + num_new) - lease.num_blocks());
    const int32_t num_residual_needed =
        request.is_forked() ? std::max(0, num_residual_blocks_for(num_computed + num_new) - residual_lease.num_blocks())
                            : 0;
    if (!kv_cache_.can_allocate(num_needed) ||
        (request.is_forked() && !residual_cache_->can_allocate(num_residual_needed)))
      break;
    LOOM_CHECK(kv_cache_.allocate(lease, num_needed));
    if (request.is_forked()) LOOM_CHECK(residual_cache_->allocate(residual_lease, num_residual_needed));
    request.num_kv_found_tokens = lease.num_found_tokens();
    request.num_residual_found_tokens = residual_lease.num_found_tokens();
    request.lease = std::move(lease);
    request.residual_lease = std::move(residual_lease);
    request.num_computed_tokens = num_computed;
    request.running = true;
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
    running_.push_back(id);
    if (!request.adapter.empty()) adapters.insert(request.adapter);

    ScheduledRequest entry = scheduled_entry(request, num_new, num_uncomputed);
    entry.num_prefix_hit_tokens = request.was_admitted ? -1 : num_computed;
    request.was_admitted = true;
    plan.requests.push_back(std::move(entry));
    budget -= num_new;
  }
  return plan;
}

bool Scheduler::is_waiting_on_load(const RequestState& request, std::span<const int32_t> lookup_tokens) {
  const KvCacheManager::PrefixStatus status = kv_cache_.prefix_status(request.kv.key, lookup_tokens);
  if (status.num_loading_tokens > 0) return true;
  if (status.num_host_tokens == 0) return false;
  // No room to load means recompute: admit with the device prefix.
  return kv_cache_.start_load(request.kv.key, lookup_tokens, status.num_host_tokens / kv_cache_.block_size(),
                              KvCacheManager::LoadReason::kDemand) > 0;
}

void Scheduler::complete_step(const ScheduledBatch& plan) {
  for (const ScheduledRequest& entry : plan.requests) {
    auto it = requests_.find(entry.id);
    if (it == requests_.end()) continue;
    RequestState& request = *it->second;
    LOOM_CHECK(request.running && request.num_computed_tokens == entry.num_computed_tokens);
    request.num_computed_tokens += entry.num_new_tokens;
    kv_cache_.commit(request.lease, request.tokens, request.num_computed_tokens);
    if (request.is_forked()) residual_cache_->commit(request.residual_lease, request.tokens, request.num_computed_tokens);
  }
}

void Scheduler::append_token(SchedulerRequestId id, int32_t token) { state(id).tokens.push_back(token); }

bool Scheduler::finish(SchedulerRequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  it->second->lease.release();
  it->second->residual_lease.release();
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
