// The engine's KV pools: the main pool and, for forked adapters, the rCache
// pool, both carved out of EngineConfig::kv_cache_bytes; the KvCacheGroup of
// their managers; the main pool's host tier and the KvTransferWorker that runs
// its copies; prefetch of the next agents' prefixes from the host tier.
//
// Sizing: the engine starts with initial_sizing(). Until the first request is
// admitted, loading a forked adapter may (re)size both pools
// (sizing_for_forked_adapter; EngineConfig::residual_kv_cache_bytes /
// max_lora_rank "at start"); the pools hold nothing yet, so nothing is lost.
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
// reads on caller threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "engine/engine.h"
#include "engine/kv_transfer_worker.h"
#include "kv/kv_cache_group.h"
#include "workflow/workflow_spec.h"

namespace loom {

// The rCache rank when EngineConfig::max_lora_rank is 0 and no loaded adapter needs more.
inline constexpr int32_t kMinAutoLoraRank = 16;

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
  // Precondition: config.block_size > 0. Allocates nothing yet.
  KvPools(Backend& backend, const EngineConfig& config);
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
  // (Re)allocates the backend's pools and the group (its managers know no
  // agent, with LRU eviction), then the host tier when the config asks for
  // one (Error(kCapacity) when that holds no block). Waits for transfers in
  // flight first. Precondition: nothing refers into caches(). When it throws,
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
  bool has_host_tier() const { return transfers_ != nullptr; }

  // Hands finished transfers to the main manager and new ones to the worker (a
  // refused one finishes as failed). Cheap; called around every step.
  void pump_transfers();
  // Waits for every transfer and applies it: before pools change or namespaces drop.
  void drain_transfers();
  bool has_transfers_in_flight() const;
  // Starts host -> device loads of the fixed prefixes of the agents closest to
  // running (steps >= 1, by steps then key), up to EngineConfig::prefetch_agents
  // agents and prefetch_max_bytes. No-op without a host tier.
  void prefetch_next_agents(const std::map<std::string, int32_t>& steps_by_agent_key);
  // Drops every cached block of the adapter's namespaces in every member
  // (after waiting for transfers). Returns blocks freed.
  int32_t drop_adapter_kv(const std::string& adapter_name);

 private:
  void setup_host_tier();

  Backend& backend_;
  const EngineConfig config_;
  const int64_t kv_bytes_per_block_;
  int64_t residual_bytes_per_block_ = 0;
  std::atomic<int32_t> num_kv_blocks_{0};
  std::atomic<int32_t> num_residual_kv_blocks_{0};
  std::atomic<int32_t> residual_max_rank_{0};
  std::unique_ptr<KvCacheGroup> caches_;
  std::optional<KvPoolLayout> layout_in_use_;
  // Host tier (nullptr: none). Declared after the group, so it is destroyed
  // (waiting for its copies) before the managers.
  std::unique_ptr<KvTransferWorker> transfers_;
};

}  // namespace loom
