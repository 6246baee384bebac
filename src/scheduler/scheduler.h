// Continuous-batching scheduler: decides, each step, which requests run and
// how many of their tokens, and holds their KV block leases. Pure host code
// (no backend headers); the engine turns a ScheduledBatch into a backend Batch.
//
// Schedule, then apply:
//   SchedulerDecision decision = schedule();   // const: a pure function of the queues and
//                                              // the KvCacheGroup (counted on a KvCapacityLedger)
//   ScheduledBatch batch = apply(decision);    // locks, allocates, preempts and starts
//                                              // demand loads, in decision order
// apply() is the one place that changes the queues and the caches. Policy 7
// (reservations and disk reads) is a decision of its own, applied before the
// step's: plan() is apply(schedule_disk_reads()), then apply(schedule()).
// apply() first holds the cached prefixes the decision admits requests onto
// (or loads after), so that the step's own allocations never evict them;
// otherwise it does what schedule() counted, in order, then starts the
// prefetches the engine asked for (policy 8), so demand loads and admissions go first.
//
// A request's tokens (prompt, then generated) and what a step computes:
//
//   tokens:  |<-- num_computed_tokens -->|<------ uncomputed ------>|
//             K/V in cache (prefix hit      this step: num_new_tokens of them
//             or earlier steps)             (all, or a prefill chunk)
//
// The step samples a new token for a request when its new tokens reach the end
// of `tokens` (ScheduledRequest::samples_next_token); the engine then calls
// append_token() (or finish()).
//
// Policy (schedule()):
//   1. Running requests, decode first (one uncomputed token), then running
//      prefills (chunked), each group in rank order; then waiting requests in
//      rank order. Rank: lower priority value first, then earlier arrival (FCFS).
//   2. At most max_batch_tokens tokens per step; a prefill takes what budget is
//      left (chunked prefill). At most max_running_requests running.
//   3. A waiting request whose adapter would make the running set use more than
//      max_loras_per_batch distinct adapters waits (later requests may pass it);
//      the base model does not count.
//   4. Preemption by recompute: when a running request needs a block and none
//      can be had, the victim is the worst-ranked running request (highest
//      priority value, then latest arrival) — possibly the request itself. The
//      victim's blocks are released (full blocks stay cached, so it often
//      re-hits them) and it goes back to waiting with num_computed_tokens = 0.
//      No waiting request is admitted in a step that preempted.
//      PreemptionMode::kSwap (vLLM v0's swap, --preemption-mode swap) instead
//      keeps its progress: its committed (tree) blocks are released as above
//      (shared ones stay with their other users; the host tier's write-through
//      backups keep them when evicted), and its private blocks that hold data
//      (the partial last block; forked: in both members) are copied to host
//      blocks of each member's HostSwapSpace (kv/host_swap_space.h), pinned on
//      the device until the copy lands (so the step does not count them as
//      freed). It falls back to recompute, counted in num_swap_fallbacks(),
//      when a member it uses has no host tier or its host pool cannot take
//      the blocks (free blocks, then host leaves). See policy 9 for its return.
//   5. A waiting request that does not get its blocks stops admission for the
//      step (FCFS; running requests are never preempted for waiting ones);
//      its cached prefix still counts as used now (LRU).
//   6. Status-aware admission (host tier): in every member the request uses
//      that has_host_tier() (for a forked request, the bCache and the rCache),
//      where its prefix lives is checked first:
//      - blocks of its prefix are loading in any member: it waits, and later
//        requests may pass it (it does not stop admission as in 5);
//      - blocks follow on the host only: a demand load of them is started in
//        each such member (start_load(kDemand)) that can have a block without
//        evicting blocks reserved for other waiting requests (policy 7; it
//        may when no room would come otherwise: nothing running, no transfer
//        in flight); if any member loads, it waits as above; if none can (no
//        room), it is admitted now with its device prefixes and recomputes
//        the rest, unless it is reserved (policy 7) and room will come: then
//        it waits for room.
//      Either way its id is in ScheduledBatch::waiting_on_load for that step. A load
//      that fails leaves the blocks off the host, so the next check admits it.
//      That is HostLoadPolicy::kBackground. Under kBlocking (HiCache's load-back,
//      the KVFlow paper's baseline) there is no status-aware admission: the first
//      request in rank order whose prefix is loading, or whose load it starts,
//      stops admission (nobody ranked after it passes it) and is the step's
//      ScheduledBatch::blocked_on_load; the engine then waits for the load
//      before the step's forward and calls resume_after_loads(), which admits
//      it (and those after it, in rank order, from the budget the step left)
//      into that same step: the step waits for its load, as HiCache's forward
//      waits for the load-back of the requests in its batch. Disk reads
//      (policy 7) are not host loads and keep their waits under both policies.
//   7. Disk tier: schedule_disk_reads() lists the waiting requests in rank
//      order (kReadFromDisk, at most kMaxDiskReadWalk); apply() walks them with
//      a host budget per member (its host blocks). It first clears every
//      reservation, then for each request, while budget is left: reserves its
//      prefix's device nodes and host nodes (disk_tier_planner.h
//      "Reservations": host ones are never evicted, device ones last) up to the
//      budget, counts them and the blocks being read for it against the
//      budget, and starts a disk -> host read (DiskTierPlanner::start_read,
//      kDemand) of the blocks that follow on disk, as many as the budget
//      leaves (they are reserved when they land).
//      The walk stops at the first request that finds no budget left. So the
//      blocks read for a request stay on the host until it is admitted (then
//      its lease holds them) or leaves, and reads never outrun the tier.
//      A request waits (as on a load, kWaitOnLoad) while its next block is
//      being read, or while it is on disk and requests ranked before it hold
//      the budget (its turn for a read comes as they are admitted; the first
//      request in line never waits for budget, so this cannot deadlock: at
//      worst it is admitted and recomputes what it could not read). When the
//      read lands, its blocks are host blocks and 6 loads them. A failed read
//      leaves them off disk.
//   8. Prefetch (host tier): the engine names the agents about to run, nearest
//      first, and a byte budget (PrefetchRequest, from KvPools); after the
//      step's actions apply() starts host -> device loads of each agent's fixed
//      prefix in every member (and disk -> host reads of what follows on disk;
//      KvCacheManager::prefetch_agent), each member at most its pool's blocks,
//      until the budget over all members is spent.
//   9. Swapped requests (policy 4, kSwap) are looked at before every other
//      waiting request, in rank order (vLLM's swapped queue goes first; with
//      chunked prefill new requests may still be admitted after them). One
//      whose swap-out copy is in flight waits. Then its committed prefix must be
//      back on the device in every member: a part on the host is loaded as in
//      policy 6 (it waits); with no room to load it waits for room (kNoRoom,
//      stopping admission), or recomputes when no room will come. Then it
//      swaps in (kSwapIn): it locks its committed prefix, takes blocks covering
//      all its tokens (so it never waits for room later) and starts copying
//      its private blocks back; it waits while they load (kBackground: others
//      pass it; kBlocking: it is the step's blocked_on_load, and the engine
//      waits for the copy as for a host load). When they landed it resumes
//      (kResumeSwapped) at its num_computed_tokens, nothing recomputed. A
//      member with nothing private swaps in at once and resumes the same step.
//      A swap whose copy failed, or whose committed prefix left the host tier
//      (host eviction, no backup), falls back to recompute (kSwapFallback,
//      counted in num_swap_fallbacks()); it is admitted as any waiting
//      request from the next step.
//
// Forked (ForkKV) requests hold two leases (RequestLeases): the shared bCache in
// the main member (RequestKvKeys::key, namespace "fork") and their rCache in
// the residual member (residual_namespace). At admission both prefixes are
// locked; they may differ in length (the trees evict independently):
//
//   tokens:   |<---- bCache hit: Lb ---->|
//             |<-- rCache hit: Lr -->|
//             |<- computed = min ---->|<----- new tokens ----->|
//   writes:   bCache from max(Lb, computed), rCache from max(Lr, computed)
//
// so a partial hit recomputes the forward over [min, ...) but writes only
// the part that is missing (ScheduledRequest::num_*_present_tokens). A step
// needs blocks in both members of the KvCacheGroup; running short in either preempts as in 4,
// except that when only the residual pool is short the victim is the
// worst-ranked running forked request (others hold no rCache to give back).
//
// Thread: engine thread only.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kv/kv_cache_group.h"

namespace loom {

// How a step treats a request whose prefix loads from the host tier (policy 6).
enum class HostLoadPolicy : uint8_t {
  kBackground,  // it waits, others run while it loads (status-aware admission; KVFlow)
  kBlocking,    // it holds its place and the step waits for its load (HiCache's load-back)
};

// What preemption does with the victim's K/V (policy 4; vLLM's --preemption-mode).
enum class PreemptionMode : uint8_t {
  kRecompute,  // release it; the request recomputes what the cache no longer holds
  kSwap,       // copy its private blocks to the host tier and keep its progress (policy 9)
};

struct SchedulerConfig {
  int32_t max_batch_tokens = 2048;
  int32_t max_running_requests = 64;
  int32_t max_loras_per_batch = 8;
  HostLoadPolicy host_load_policy = HostLoadPolicy::kBackground;
  PreemptionMode preemption_mode = PreemptionMode::kRecompute;
};

using SchedulerRequestId = int64_t;

struct ScheduledRequest {
  SchedulerRequestId id = 0;
  int32_t num_computed_tokens = 0;  // K/V already in the cache (positions 0 .. this-1)
  int32_t num_new_tokens = 0;       // tokens [num_computed_tokens, num_computed_tokens + num_new_tokens)
  std::vector<int32_t> block_ids;   // covers num_computed_tokens + num_new_tokens (may hold more)
  // Main K/V entries [0, num_kv_present_tokens) already hold data (>= num_computed_tokens
  // after a partial forked hit; else == num_computed_tokens): the backend must not write them.
  int32_t num_kv_present_tokens = 0;
  // Forked only: the rCache lease's blocks and how many entries already hold data.
  std::vector<int32_t> residual_block_ids;
  int32_t num_residual_present_tokens = 0;
  bool samples_next_token = false;
  // Set when this step admitted the request from waiting: prompt tokens found
  // in the prefix cache (first admission only; -1 otherwise).
  int32_t num_prefix_hit_tokens = -1;
};

// What one step runs (apply()'s result).
struct ScheduledBatch {
  std::vector<ScheduledRequest> requests;  // decode requests first
  std::vector<SchedulerRequestId> preempted;
  // Waiting requests held back this step because their prefix is (now) loading
  // from the host tier (policy 6). The engine measures their wait.
  std::vector<SchedulerRequestId> waiting_on_load;
  // HostLoadPolicy::kBlocking: the request admission stopped at (empty or one id, also
  // in waiting_on_load). The step must not run before its load lands: the engine waits
  // for transfers, then resume_after_loads() until this is empty.
  std::vector<SchedulerRequestId> blocked_on_load;
  int32_t num_disk_read_blocks = 0;  // blocks (all members) whose disk reads the plan started (policy 7)
  int32_t num_tokens() const;
  bool empty() const { return requests.empty(); }
};

// Policy 8: what to prefetch after a step (engine/kv_pools.h builds it).
struct PrefetchRequest {
  std::vector<std::string> agent_keys;  // nearest to running first
  int64_t max_bytes = 0;                // over every member together
  PerKvCache<int64_t> bytes_per_block;  // each member's block size in bytes (> 0 where present)
};

// One decision of schedule(); apply() carries them out in order.
struct SchedulerAction {
  enum class Kind : uint8_t {
    kPreempt,     // a running request: release its leases, back to waiting from token 0 (policy 4)
    kRun,         // a running request: add num_new_blocks, compute num_new_tokens
    kAdmit,       // a waiting request: lock num_found_blocks of its cached prefix in each member
                  // it uses, add num_new_blocks, compute num_new_tokens from num_computed_tokens
    kStartLoad,   // a waiting request: start a demand load of its host blocks; it waits (policy 6)
    kWaitOnLoad,  // a waiting request whose prefix is loading: it waits (policy 6)
    kNoRoom,      // a waiting request whose blocks cannot be had: its cached prefix counts as
                  // used now (LRU), and admission stops for the step (policy 5)
    kReadFromDisk,  // a waiting request, in rank order (policy 7): reserve its prefix within the host
                    // budget the requests before it left, and start a demand read of what follows on disk
    kSwapOut,       // a running request: preempt by swap (policy 4, kSwap); recompute if the host cannot take it
    kSwapIn,        // a swapped request (policy 9): lock num_found_blocks, add num_new_blocks, copy back
    kResumeSwapped,  // a swapped request whose copies landed: running again, num_new_tokens from where it was
    kSwapFallback,  // a swapped request that lost its K/V: back to waiting from token 0 (policy 9)
  };
  Kind kind = Kind::kRun;
  SchedulerRequestId id = 0;
  int32_t num_new_tokens = 0;       // kRun, kAdmit
  int32_t num_computed_tokens = 0;  // kAdmit: the prefix found in every member it uses
  KvBlockCounts num_new_blocks;     // kRun, kAdmit: blocks per member beyond the (locked) leases
  KvBlockCounts num_found_blocks;   // kAdmit: blocks of each member's cached prefix it locks;
                                    // kStartLoad: device blocks each loading member's load pins
  KvBlockCounts num_load_blocks;    // kStartLoad: host blocks to load per member (0: none; else at
                                    // least one can be had)

  static SchedulerAction preempt(SchedulerRequestId id) { return of(Kind::kPreempt, id); }
  static SchedulerAction run(SchedulerRequestId id, int32_t num_new_tokens, const KvBlockCounts& num_new_blocks) {
    SchedulerAction action = of(Kind::kRun, id);
    action.num_new_tokens = num_new_tokens;
    action.num_new_blocks = num_new_blocks;
    return action;
  }
  static SchedulerAction admit(SchedulerRequestId id, int32_t num_new_tokens, int32_t num_computed_tokens,
                               const KvBlockCounts& num_new_blocks, const KvBlockCounts& num_found_blocks) {
    SchedulerAction action = run(id, num_new_tokens, num_new_blocks);
    action.kind = Kind::kAdmit;
    action.num_computed_tokens = num_computed_tokens;
    action.num_found_blocks = num_found_blocks;
    return action;
  }
  static SchedulerAction start_load(SchedulerRequestId id, const KvBlockCounts& num_pinned_blocks,
                                    const KvBlockCounts& num_load_blocks) {
    SchedulerAction action = of(Kind::kStartLoad, id);
    action.num_found_blocks = num_pinned_blocks;
    action.num_load_blocks = num_load_blocks;
    return action;
  }
  static SchedulerAction wait_on_load(SchedulerRequestId id) { return of(Kind::kWaitOnLoad, id); }
  static SchedulerAction no_room(SchedulerRequestId id) { return of(Kind::kNoRoom, id); }
  static SchedulerAction read_from_disk(SchedulerRequestId id) { return of(Kind::kReadFromDisk, id); }
  static SchedulerAction swap_out(SchedulerRequestId id) { return of(Kind::kSwapOut, id); }
  static SchedulerAction swap_in(SchedulerRequestId id, const KvBlockCounts& num_found_blocks,
                                 const KvBlockCounts& num_new_blocks) {
    SchedulerAction action = of(Kind::kSwapIn, id);
    action.num_found_blocks = num_found_blocks;
    action.num_new_blocks = num_new_blocks;
    return action;
  }
  static SchedulerAction resume_swapped(SchedulerRequestId id, int32_t num_new_tokens,
                                        const KvBlockCounts& num_new_blocks) {
    SchedulerAction action = run(id, num_new_tokens, num_new_blocks);
    action.kind = Kind::kResumeSwapped;
    return action;
  }
  static SchedulerAction swap_fallback(SchedulerRequestId id) { return of(Kind::kSwapFallback, id); }

 private:
  static SchedulerAction of(Kind kind, SchedulerRequestId id) {
    SchedulerAction action;
    action.kind = kind;
    action.id = id;
    return action;
  }
};

struct SchedulerDecision {
  std::vector<SchedulerAction> actions;
  // Policy 7 (schedule_disk_reads): apply() first clears every reservation,
  // then walks the kReadFromDisk actions.
  bool starts_disk_walk = false;
  // More requests were waiting than the walk takes; those past it count as past the budget.
  bool is_disk_walk_cut_short = false;
  // Policy 8: started after the actions (empty: none).
  PrefetchRequest prefetch;
  // Policy 6 under HostLoadPolicy::kBlocking: ScheduledBatch::blocked_on_load.
  std::vector<SchedulerRequestId> blocked_on_load;
};

class Scheduler {
 public:
  // `kv_caches` must outlive the scheduler.
  Scheduler(SchedulerConfig config, KvCacheGroup& kv_caches);
  ~Scheduler();

  // Queues a request. `adapter` is "" for the base model (it counts towards
  // max_loras_per_batch otherwise); `kv` keys its cached blocks.
  // Preconditions: a new id, a non-empty prompt; a residual_namespace only
  // when the KvCacheGroup has a residual member.
  void add(SchedulerRequestId id, std::vector<int32_t> prompt_tokens, std::string adapter, RequestKvKeys kv,
           int32_t priority);
  void add(SchedulerRequestId id, std::vector<int32_t> prompt_tokens, std::string adapter, std::string kv_namespace,
           int32_t priority) {
    add(id, std::move(prompt_tokens), std::move(adapter), RequestKvKeys{KvKey::single(std::move(kv_namespace)), ""},
        priority);
  }
  // The step's decisions (policy above), from the queues and the KvCacheGroup
  // as they are now, with the prefetches asked for (none without a host tier).
  // With `blocked` (a batch whose blocked_on_load is set, applied, nothing else
  // changed since but transfers): the rest of that step, admissions only, in
  // rank order, from the budget and running slots it left (policy 6, kBlocking).
  // Changes nothing.
  SchedulerDecision schedule(const PrefetchRequest& prefetch = {}, const ScheduledBatch* blocked = nullptr) const;
  // Policy 7's walk: a kReadFromDisk action per waiting request, in rank
  // order (none without a disk tier). Changes nothing.
  SchedulerDecision schedule_disk_reads() const;
  // Carries out a decision of schedule() (or schedule_disk_reads()) made with
  // nothing changed since: re-derives reservations and starts disk reads,
  // preempts, locks prefixes, allocates, starts loads; returns the batch.
  ScheduledBatch apply(const SchedulerDecision& decision);
  // apply(schedule_disk_reads()) (with a disk tier), then
  // apply(schedule(prefetch)), whose batch counts the disk reads started.
  ScheduledBatch plan(const PrefetchRequest& prefetch = {});
  // kBlocking: `blocked` (the step so far) with apply(schedule({}, &blocked))
  // added: its requests, waits and blocked_on_load (again the blocked request
  // when its load has not landed yet). Call after transfers finished.
  ScheduledBatch resume_after_loads(ScheduledBatch blocked);
  // After the backend ran the batch: advances num_computed_tokens and commits
  // full blocks to the cache. Call before append_token / finish.
  void complete_step(const ScheduledBatch& batch);
  void append_token(SchedulerRequestId id, int32_t token);
  // Removes the request (finished or cancelled), releasing its blocks. Returns
  // false for an unknown id. Safe at any point between steps.
  bool finish(SchedulerRequestId id);

  bool contains(SchedulerRequestId id) const;
  const std::vector<int32_t>& tokens(SchedulerRequestId id) const;
  int32_t num_computed_tokens(SchedulerRequestId id) const;
  bool is_running(SchedulerRequestId id) const;
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  // Preemptions since start (both modes); of them, those that swapped (policy 4, kSwap).
  int64_t num_preemptions() const { return num_preemptions_; }
  int64_t num_swap_preemptions() const { return num_swap_preemptions_; }
  // kSwap only: swaps that became recomputes (at swap-out: no host tier or no
  // host room; at swap-in: a failed copy or a committed prefix gone).
  int64_t num_swap_fallbacks() const { return num_swap_fallbacks_; }
  // Requests swapped out or swapping in now (waiting).
  int32_t num_swapped() const;
  std::vector<SchedulerRequestId> running_ids() const { return running_; }

 private:
  struct RequestState;
  class Planner;  // schedule()'s working state (scheduler.cc)
  RequestState& state(SchedulerRequestId id);
  const RequestState& state(SchedulerRequestId id) const;
  // `ids` in rank order: priority (lower first), then arrival.
  std::vector<SchedulerRequestId> sorted(const std::vector<SchedulerRequestId>& ids) const;
  ScheduledRequest scheduled_entry(const RequestState& request, int32_t num_new_tokens) const;
  // apply()'s steps.
  void apply_preempt(SchedulerRequestId id, ScheduledBatch& batch);
  // Policies 4 (kSwap) and 9 (scheduler_swap.cc).
  bool can_swap_out(const RequestState& request) const;
  void apply_swap_out(SchedulerRequestId id, ScheduledBatch& batch);
  void apply_swap_in(const SchedulerAction& action, ScheduledBatch& batch);
  void apply_resume_swapped(const SchedulerAction& action, ScheduledBatch& batch);
  void apply_swap_fallback(SchedulerRequestId id);
  // Forgets the request's swaps (their host blocks are freed) and clears `swapped`.
  void drop_swaps(RequestState& request);
  void apply_admit(const SchedulerAction& action, ScheduledBatch& batch);
  void begin_disk_walk();
  // Returns the blocks whose reads it started.
  int32_t apply_disk_read(SchedulerRequestId id, KvBlockCounts& num_reserved);
  void apply_prefetch(const PrefetchRequest& prefetch);

  SchedulerConfig config_;
  KvCacheGroup& kv_caches_;
  int64_t next_arrival_ = 0;
  int64_t num_preemptions_ = 0, num_swap_preemptions_ = 0, num_swap_fallbacks_ = 0;
  std::map<SchedulerRequestId, std::unique_ptr<RequestState>> requests_;
  std::vector<SchedulerRequestId> running_;
  std::vector<SchedulerRequestId> waiting_;
  // Policy 7: the last disk walk applied, and whether it stopped for want of host budget (or
  // after kMaxDiskReadWalk waiting requests: a step's work stays bounded however long the queue).
  static constexpr int32_t kMaxDiskReadWalk = 256;
  int64_t disk_walk_id_ = 0;
  bool is_host_budget_spent_ = false;
};

}  // namespace loom
