#include "scheduler/scheduler.h"

#include <algorithm>
#include <set>

#include "util/error.h"

namespace loom {

struct Scheduler::RequestState {
  SchedulerRequestId id = 0;
  std::vector<int32_t> tokens;
  std::string adapter;
  std::string kv_namespace;
  int32_t priority = 0;
  int64_t arrival = 0;
  int32_t num_computed_tokens = 0;
  bool was_admitted = false;
  bool running = false;
  KvLease lease;
};

int32_t StepPlan::num_tokens() const {
  int32_t total = 0;
  for (const auto& request : requests) total += request.num_new_tokens;
  return total;
}

Scheduler::Scheduler(SchedulerConfig config, KvCacheManager& kv_cache) : config_(config), kv_cache_(kv_cache) {
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

void Scheduler::add(SchedulerRequestId id, std::vector<int32_t> prompt_tokens, std::string adapter,
                    std::string kv_namespace, int32_t priority) {
  LOOM_CHECK(!prompt_tokens.empty() && requests_.count(id) == 0);
  auto request = std::make_unique<RequestState>();
  request->id = id;
  request->tokens = std::move(prompt_tokens);
  request->adapter = std::move(adapter);
  request->kv_namespace = std::move(kv_namespace);
  request->priority = priority;
  request->arrival = next_arrival_++;
  requests_.emplace(id, std::move(request));
  waiting_.push_back(id);
}

void Scheduler::preempt(SchedulerRequestId id, StepPlan& plan, int32_t& budget) {
  RequestState& request = state(id);
  LOOM_CHECK(request.running);
  request.lease.release();
  request.num_computed_tokens = 0;
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

StepPlan Scheduler::plan() {
  StepPlan plan;
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
    const int32_t num_needed =
        std::max(0, num_blocks_for(request.num_computed_tokens + num_new) - request.lease.num_blocks());
    bool preempted_self = false;
    while (!kv_cache_.can_allocate(num_needed)) {
      const SchedulerRequestId victim = sorted(running_).back();
      preempt(victim, plan, budget);
      if (victim == id) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) continue;
    LOOM_CHECK(kv_cache_.allocate(request.lease, num_needed));
    ScheduledRequest entry;
    entry.id = id;
    entry.num_cached_tokens = request.num_computed_tokens;
    entry.num_new_tokens = num_new;
    entry.block_ids = request.lease.block_ids();
    entry.samples_next_token = num_new == num_uncomputed;
    plan.requests.push_back(std::move(entry));
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
    KvLease lease = kv_cache_.lock_prefix(request.kv_namespace, all_tokens.first(all_tokens.size() - 1));
    const int32_t num_computed = lease.num_cached_tokens();
    const int32_t num_uncomputed = static_cast<int32_t>(request.tokens.size()) - num_computed;
    const int32_t num_new = std::min(num_uncomputed, budget);
    const int32_t num_needed = num_blocks_for(num_computed + num_new) - lease.num_blocks();
    if (!kv_cache_.allocate(lease, num_needed)) break;
    request.lease = std::move(lease);
    request.num_computed_tokens = num_computed;
    request.running = true;
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), id));
    running_.push_back(id);
    if (!request.adapter.empty()) adapters.insert(request.adapter);

    ScheduledRequest entry;
    entry.id = id;
    entry.num_cached_tokens = num_computed;
    entry.num_new_tokens = num_new;
    entry.block_ids = request.lease.block_ids();
    entry.samples_next_token = num_new == num_uncomputed;
    entry.num_prefix_hit_tokens = request.was_admitted ? -1 : num_computed;
    request.was_admitted = true;
    plan.requests.push_back(std::move(entry));
    budget -= num_new;
  }
  return plan;
}

void Scheduler::complete_step(const StepPlan& plan) {
  for (const ScheduledRequest& entry : plan.requests) {
    auto it = requests_.find(entry.id);
    if (it == requests_.end()) continue;
    RequestState& request = *it->second;
    LOOM_CHECK(request.running && request.num_computed_tokens == entry.num_cached_tokens);
    request.num_computed_tokens += entry.num_new_tokens;
    kv_cache_.commit(request.lease, request.tokens, request.num_computed_tokens);
  }
}

void Scheduler::append_token(SchedulerRequestId id, int32_t token) { state(id).tokens.push_back(token); }

bool Scheduler::finish(SchedulerRequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  it->second->lease.release();
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
