// The engine's KV pools: the main pool and, for forked adapters, the rCache
// pool, both carved out of EngineConfig::kv_cache_bytes; the KvCacheGroup of
// their managers; their host tiers and the KvTransferWorker that runs the
// copies of both; which agents' prefixes to prefetch (the scheduler starts them).
//
// Host tier sizing (num_host_blocks): one budget, EngineConfig::host_kv_cache_bytes
// (--host-kv-memory), split between the members. The rCache pool gets
// host_residual_kv_cache_bytes of it, by default (-1) its share of the device
// pools' bytes:
//
//   residual host bytes = budget * residual device bytes / (main + residual device bytes)
//
// so both host pools hold the same multiple of their device pool (a forked
// agent's bCache and rCache prefixes outlive device eviction alike). The main
// pool gets the rest. Without an rCache pool, or with a backend that has no
// rCache host tier (BackendCapabilities::residual_host_kv_tier), the main
// pool gets it all. allocate() splits it again for each layout (an rCache pool
// made when a forked adapter is loaded takes its share then). Each member
// plans its own transfers; the worker carries the member with each
// (KvCacheGroup::MemberTransfer) and the copy goes to that member's backend
// pool (kv_pool_kind).
//
// Sizing: the engine starts with initial_sizing(). Until the first request is
// admitted, loading a forked adapter may (re)size both pools
// (sizing_for_forked_adapter; EngineConfig::residual_kv_cache_bytes /
// max_lora_rank "at start"); the pools hold nothing yet, so nothing is lost.
//
// Disk tier (EngineConfig::disk_kv_path): KvPools opens the DiskKvStore at
// construction (or takes EngineConfig::kv_store, a disaggregated engine's
// buffered store, shared with the server) and, with the host tiers, enables the disk tier on every member
// that has one (kv/disk_tier_planner.h). Block names chain from a salt
// per member: the model's fingerprint, the member's layout (block size,
// bytes per block, so a CPU fp32 pool never reads a CUDA bf16 one, and the KV
// dtype, so an fp8 block never mixes with a bf16 one: kv_identity.h) and its
// name; an adapter's namespaces also hash its fingerprint (set_adapter_identity).
// The worker's copy function does the I/O: an offload writes the blocks it
// names after the device -> host copy (a failed write is logged by the store
// and the offload still succeeds); a disk read reads into the host blocks and
// fails as a whole when any block does not verify.
//
// Block names and events: every member names its blocks (content hashes,
// KvCacheManager::enable_block_hashes, with the salts above) when there is a
// disk tier or an event sink. With a sink (the engine's KV event publisher)
// every member reports its blocks to it, and allocate() tells it that all
// blocks were cleared before it builds the new group.
//
// Ownership: KvPools owns the group, the host tier set-up and the worker; the
// backend (which holds the tensors) must outlive it. allocate() replaces the
// group, so whatever refers into it must go first: the engine destroys its
// Scheduler (which must hold no request) before allocate() and builds a new
// one over caches() after it.
//
// Thread: engine thread only (the constructor and allocate() may run on the
// constructing thread before the engine thread starts), except the counts
// num_kv_blocks / num_residual_kv_blocks / residual_max_rank, which submit()
// reads on caller threads, and block_names (the naming it reads is locked).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "engine/engine.h"
#include "engine/kv_transfer_worker.h"
#include "kv/kv_cache_group.h"
#include "kvstore/disk_kv_store.h"
#include "scheduler/scheduler.h"
#include "workflow/workflow_spec.h"

namespace loom {

// The rCache rank when EngineConfig::max_lora_rank is 0 and no loaded adapter needs more.
inline constexpr int32_t kMinAutoLoraRank = 16;

// The backend pool that holds a group member's blocks.
inline KvPoolKind kv_pool_kind(KvCacheId id) {
  return id == KvCacheId::kMain ? KvPoolKind::kMain : KvPoolKind::kResidual;
}

// The disk tier's store as EngineConfig's disk_kv_* fields describe it
// (disk_kv_path set). Throws Error(kInvalidArgument) when it cannot be used or
// disk_kv_bytes is not positive.
std::unique_ptr<DiskKvStore> open_disk_tier(const EngineConfig& config);

// The pools asked for.
struct KvPoolSizing {
  bool with_residual = false;  // an rCache pool (and the group's residual member)
  int64_t residual_bytes = 0;  // its bytes when EngineConfig::num_residual_kv_blocks is 0
  int32_t max_rank = 0;        // the k/v LoRA rank its slots hold
};

// Block counts that allocate() gives the pools (KvPools::layout of a sizing).
struct KvPoolLayout {
  int32_t num_blocks = 0;
  int32_t num_residual_blocks = 0;  // 0: no rCache pool
  int64_t residual_bytes_per_block = 0;
  int32_t residual_max_rank = 0;
};

class KvPools {
 public:
  // Precondition: config.block_size > 0. Allocates no pool yet; opens the disk
  // tier's store when config.disk_kv_path is set (Error(kInvalidArgument) when
  // it cannot be used, or without a host tier or a positive disk_kv_bytes).
  // model_identity: model_fingerprint() of the weights (kv_identity.h).
  // events: where the members report their blocks (nullptr: nowhere); must
  // outlive the pools.
  KvPools(Backend& backend, const EngineConfig& config, const KvBlockHash& model_identity = {},
          KvEventSink* events = nullptr);
  ~KvPools();
  KvPools(const KvPools&) = delete;
  KvPools& operator=(const KvPools&) = delete;

  // The pools at start: an rCache pool when asked for explicitly or when every
  // adapter is forked by default; otherwise the first forked adapter loaded
  // before any request makes one (sizing_for_forked_adapter).
  KvPoolSizing initial_sizing() const;
  // The block counts of `sizing`. Throws Error(kCapacity) when a pool would
  // hold no block, Error(kUnsupported) when the backend has no rCache. Changes
  // nothing, so a refused sizing leaves the pools (and their users) as they are.
  KvPoolLayout layout(const KvPoolSizing& sizing) const;
  // Host blocks of each member for the device pools of `layout` (0: no host
  // tier there; all 0 without a host budget). Throws Error(kCapacity) when the
  // main pool's share holds no block, or an rCache share asked for explicitly
  // holds none; Error(kInvalidArgument) when that share is over the budget.
  KvBlockCounts num_host_blocks(const KvPoolLayout& layout) const;
  // (Re)allocates the backend's pools and the group (its managers know no
  // agent, with LRU eviction), then the host tiers of num_host_blocks(layout)
  // (throwing as it does). Waits for transfers in flight first.
  // Precondition: nothing refers into caches(). When it throws,
  // there are no pools (allocated() is false) until an allocate() succeeds.
  void allocate(const KvPoolLayout& layout);
  bool allocated() const { return caches_ != nullptr; }
  // The layout of the pools now (nullopt before the first allocate() succeeds).
  const std::optional<KvPoolLayout>& layout_in_use() const { return layout_in_use_; }
  // For a forked adapter of k/v rank `kv_rank`: nullopt when the rCache pool
  // holds it already, else the sizing that does (max_loaded_kv_rank: the
  // largest among the adapters loaded or being loaded). Throws Error(kCapacity)
  // with a hint when the rank is over the configured maximum, when there may be
  // no rCache pool, or when `any_request_admitted` fixed the pools.
  std::optional<KvPoolSizing> sizing_for_forked_adapter(const std::string& name, int32_t kv_rank,
                                                        int32_t max_loaded_kv_rank, bool any_request_admitted) const;

  KvCacheGroup& caches() { return *caches_; }
  const KvCacheGroup& caches() const { return *caches_; }
  int32_t num_kv_blocks() const { return num_kv_blocks_.load(); }
  int32_t num_residual_kv_blocks() const { return num_residual_kv_blocks_.load(); }
  int32_t residual_max_rank() const { return residual_max_rank_.load(); }
  int64_t kv_bytes_per_block() const { return kv_bytes_per_block_; }
  int64_t residual_bytes_per_block() const { return residual_bytes_per_block_; }  // 0 without an rCache pool
  // Bytes of one block of member `id` (0 for an absent one).
  int64_t bytes_per_block(KvCacheId id) const {
    return id == KvCacheId::kMain ? kv_bytes_per_block_ : residual_bytes_per_block_;
  }
  // Whether any member has a host tier.
  bool has_host_tier() const { return transfers_ != nullptr; }

  // Hands finished transfers back to the members that planned them and new
  // ones to the worker (a refused one finishes as failed). Cheap; called
  // around every step.
  void pump_transfers();
  // Waits for every transfer and applies it: before pools change or namespaces drop.
  void drain_transfers();
  // Waits until a submitted transfer has ended (at once when one has and is not handed back
  // yet, or none is in flight), then pumps: the engine's wait for a load under
  // --host-load-policy blocking. Pump first, so that what was planned is submitted.
  void wait_for_transfer();
  bool has_transfers_in_flight() const;
  // What the scheduler should prefetch after the step (its policy 8): the
  // agents closest to running (steps >= 1, by steps then key), up to
  // EngineConfig::prefetch_agents of them, within prefetch_max_bytes (over the
  // members together). Empty without a host tier. Changes nothing.
  PrefetchRequest prefetch_request(const std::map<std::string, int32_t>& steps_by_agent_key) const;
  // Drops every cached block of the adapter's namespaces in every member
  // (after waiting for transfers). Returns blocks freed.
  int32_t drop_adapter_kv(const std::string& adapter_name);
  // The names (content hashes) and payload bytes of the full blocks of
  // `tokens` under `keys`, in every member the keys use (main first), as the
  // members name them; empty when blocks are not named. Any thread (it reads
  // only the naming, which the engine thread changes under a lock).
  std::vector<KvBlockName> block_names(const RequestKvKeys& keys, std::span<const int32_t> tokens) const;
  // The adapter's fingerprint (kv_identity.h), salting its namespaces' block
  // names on disk; forget it when it is unloaded (after drop_adapter_kv).
  void set_adapter_identity(const std::string& adapter_name, const KvBlockHash& fingerprint);
  void forget_adapter_identity(const std::string& adapter_name);
  // Whether blocks get content hashes (a disk tier or an event sink): then
  // adapters' fingerprints salt their namespaces (set_adapter_identity).
  bool names_blocks() const { return disk_store_ != nullptr || events_ != nullptr; }
  // The disk tier's store (nullptr: none). Its stats() may be read from any thread.
  const DiskKvStore* disk_store() const { return disk_store_.get(); }

 private:
  // Block hashes on every member when names_blocks(), and the event sink.
  void setup_block_names();
  void setup_host_tier(const KvPoolLayout& layout);

  class StoreDirectory;  // KvBlockDirectory over disk_store_
  KvBlockHash namespace_salt(const std::string& kv_namespace) const;

  Backend& backend_;
  const EngineConfig config_;
  const int64_t kv_bytes_per_block_;
  int64_t residual_bytes_per_block_ = 0;
  std::atomic<int32_t> num_kv_blocks_{0};
  std::atomic<int32_t> num_residual_kv_blocks_{0};
  std::atomic<int32_t> residual_max_rank_{0};
  const KvBlockHash model_identity_;
  KvEventSink* const events_;
  std::shared_ptr<DiskKvStore> disk_store_;
  std::unique_ptr<StoreDirectory> disk_directory_;
  // Block naming, read by block_names() on any thread: guarded by naming_mutex_.
  mutable std::mutex naming_mutex_;
  std::map<std::string, KvBlockHash> adapter_identities_;
  PerKvCache<KvBlockHash> cache_salts_;  // zero: the member is absent or unnamed
  PerKvCache<int64_t> cache_block_bytes_;
  std::unique_ptr<KvCacheGroup> caches_;
  std::optional<KvPoolLayout> layout_in_use_;
  // Host tier (nullptr: none). Declared after the group, so it is destroyed
  // (waiting for its copies) before the managers.
  std::unique_ptr<KvTransferWorker> transfers_;
};

}  // namespace loom
