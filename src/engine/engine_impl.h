// The Engine of engine.h: one engine thread that loops
//   inbox (new requests, cancels, adapter commands) -> Scheduler::plan ->
//   build_batch -> Backend::forward -> per-request sampling/detokenizing ->
//   RequestChannel outputs,
// and checks the KV cache's integrity whenever it goes idle.
//
// Adapters: loaded on the caller's thread (file I/O), then bound to a backend
// slot by a command run on the engine thread; every loaded adapter stays bound
// until unloaded. Each has a KvSharing mode (choose_kv_sharing) that keys its
// requests' KV (engine/request_kv.h); unloading drops every namespace of the
// adapter (kv_namespace_belongs_to_adapter) in both cache managers, so a later
// adapter with the same name never sees stale K/V.
//
// Pools (engine_pools.cc): the main KV pool and, for forked adapters, the
// rCache pool with its own KvCacheManager, both carved out of kv_cache_bytes.
// Until the first request is admitted, loading a forked adapter may (re)size
// them (EngineConfig::residual_kv_cache_bytes / max_lora_rank "at start").
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "engine/engine.h"
#include "engine/engine_request.h"
#include "engine/kv_transfer_worker.h"
#include "engine/request_channel.h"
#include "kv/kv_cache_manager.h"
#include "scheduler/scheduler.h"
#include "workflow/fixed_prefix_tracker.h"
#include "workflow/workflow_registry.h"

namespace loom {

// The rCache rank when EngineConfig::max_lora_rank is 0 and no loaded adapter needs more.
inline constexpr int32_t kMinAutoLoraRank = 16;

// The registry's settings from EngineConfig (workflow_ttl_seconds, max_workflows,
// max_workflow_agents; a ttl <= 0 or NaN throws Error(kInvalidArgument), as the
// registry does for bad caps).
WorkflowRegistryConfig workflow_registry_config(const EngineConfig& config);

class EngineImpl final : public Engine {
 public:
  EngineImpl(LoadedModel model, std::unique_ptr<Backend> backend, EngineConfig config);
  ~EngineImpl() override;

  std::unique_ptr<RequestStream> submit(EngineRequest request) override;
  void load_adapter(const std::string& name, const std::string& path,
                    std::optional<KvSharing> sharing = std::nullopt) override;
  void unload_adapter(const std::string& name) override;
  std::vector<AdapterInfo> adapters() const override;
  EngineMetrics take_metrics() override;
  WorkflowRegistry& workflows() override { return workflows_; }
  const LoadedModel& model() const override { return model_; }
  int32_t max_context_tokens() const override { return max_context_tokens_; }
  void shutdown(bool drain) override;

  // Number of KV blocks the pool was given (derived from kv_cache_bytes when 0).
  int32_t num_kv_blocks() const { return num_kv_blocks_.load(); }
  // rCache blocks (0 without an rCache pool) and the rank its slots hold.
  int32_t num_residual_kv_blocks() const { return num_residual_kv_blocks_.load(); }
  int32_t residual_max_rank() const { return residual_max_rank_.load(); }
  // Runs `command` on the engine thread and waits for it (or runs it here when
  // the thread has exited). Rethrows what it throws. Tests use it to inspect
  // or evict the cache between requests.
  void run_on_engine_thread(const std::function<void()>& command);
  // Engine thread only (inside run_on_engine_thread).
  KvCacheManager& kv_cache() { return *kv_cache_; }
  KvCacheManager* residual_kv_cache() { return residual_kv_cache_; }

 private:
  struct AdapterEntry {
    std::string path;
    std::shared_ptr<const LoraAdapter> adapter;
    int32_t slot = 0;
    int32_t num_running_requests = 0;
    bool ready = false;  // bound in the backend
    KvSharing sharing = KvSharing::kIsolated;
  };

  void thread_main();
  bool take_inbox(bool& stop_now);  // returns whether the thread should exit
  void admit(std::unique_ptr<PendingRequest> request);
  void handle_cancellations();
  void step();
  void end_request(int64_t id, RequestOutput final_output);
  void fail_all(const Error& error);
  void publish_gauges();
  // engine_pools.cc. Engine thread (or the constructor): (re)allocates the main
  // pool and, when with_residual, the rCache pool; recreates the managers and
  // the scheduler (which must hold no request).
  void allocate_pools(bool with_residual, int64_t residual_bytes, int32_t max_rank);
  // Engine thread: makes sure the rCache pool can hold a forked adapter of k/v
  // rank `kv_rank`, resizing while no request was admitted yet; else throws
  // with a hint.
  void prepare_forked_adapter(const std::string& name, int32_t kv_rank);
  // engine_workflows.cc, engine thread. Once per step: expires workflows (at
  // most once a second) and, when the registry's version moved, pushes the
  // agents' steps to both managers and forgets agents of ended workflows.
  void sync_workflows();
  // At admission: the request's agent key and fixed prefix length (tracker).
  void observe_workflow_hints(PendingRequest& request);
  // After complete_step: declares the fixed prefixes whose blocks this step
  // committed (or found cached) to the managers.
  void declare_fixed_prefixes(const ScheduledBatch& plan);
  // After allocate_pools: the new managers get the policy and know no agent yet.
  void reset_workflow_kv_state();
  // Engine thread: drops every cached block of the adapter's namespaces in
  // both managers (no request may use the adapter). Returns blocks freed.
  int32_t drop_adapter_kv(const std::string& name);
  // engine_host_tier.cc, engine thread. After allocate_pools made the managers:
  // the host pool, the manager's host tier and the transfer worker (when
  // host_kv_cache_bytes / num_host_kv_blocks ask for one).
  void setup_host_tier();
  // Hands finished transfers to the manager and new ones to the worker (a
  // refused one finishes as failed). Cheap; called around every step.
  void pump_kv_transfers();
  // Waits for every transfer and applies it: before pools change or namespaces drop.
  void drain_kv_transfers();
  bool has_kv_transfers_in_flight() const;
  // Starts loads of the next agents' fixed prefixes (EngineConfig::prefetch_agents).
  void prefetch_next_agents();
  // Load-wait bookkeeping and metrics for one plan.
  void note_load_waits(const ScheduledBatch& plan, SteadyTime now);

  LoadedModel model_;
  std::unique_ptr<Backend> backend_;
  EngineConfig config_;
  const BackendCapabilities capabilities_;  // the backend's, read once
  WorkflowRegistry workflows_;  // thread-safe; outlives the engine thread
  int32_t max_context_tokens_ = 0;
  std::atomic<int32_t> num_kv_blocks_{0};
  std::atomic<int32_t> num_residual_kv_blocks_{0};
  std::atomic<int32_t> residual_max_rank_{0};
  int64_t kv_bytes_per_block_ = 0;
  int64_t residual_bytes_per_block_ = 0;  // engine thread (and metrics under metrics_mutex_)
  std::vector<TokenId> eos_ids_;

  // Engine thread only.
  std::unique_ptr<KvCacheGroup> kv_caches_;
  KvCacheManager* kv_cache_ = nullptr;           // kv_caches_->main()
  KvCacheManager* residual_kv_cache_ = nullptr;  // nullptr: no rCache pool
  std::unique_ptr<Scheduler> scheduler_;
  // Host tier (nullptr: none). Declared after the managers, so it is destroyed
  // (draining its copies) before them; the backend outlives it.
  std::unique_ptr<KvTransferWorker> kv_transfers_;
  int32_t num_host_kv_blocks_ = 0;
  bool any_request_admitted_ = false;  // pools are fixed from then on
  std::unordered_map<int64_t, std::unique_ptr<PendingRequest>> active_;
  // Workflow state of the engine thread (engine_workflows.cc).
  FixedPrefixTracker prefix_tracker_;
  std::shared_ptr<const WorkflowSnapshot> workflow_snapshot_;  // as last pushed to the managers
  bool workflow_steps_pushed_ = false;                          // workflow_snapshot_'s steps are in the managers
  std::map<std::string, int32_t> pushed_agent_steps_;           // agent key ("wf/agent") -> steps, as pushed
  std::chrono::steady_clock::time_point last_workflow_expiry_{};
  bool idle_checked_ = false;

  std::shared_ptr<EngineInbox> inbox_ = std::make_shared<EngineInbox>();
  std::atomic<int64_t> next_id_{1};
  std::atomic<int32_t> num_in_inbox_{0};          // submitted, not yet seen by the engine thread
  std::atomic<int32_t> num_scheduler_waiting_{0};  // in the scheduler's waiting queue

  mutable std::mutex adapters_mutex_;
  std::map<std::string, AdapterEntry> adapters_;
  std::vector<bool> slot_used_;

  std::mutex metrics_mutex_;
  EngineMetrics metrics_;

  std::mutex shutdown_mutex_;
  std::thread thread_;
};

}  // namespace loom
