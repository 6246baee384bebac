// The Engine of engine.h: one engine thread that loops
//   inbox (new requests, cancels, commands) -> step() -> publish metrics and outputs,
// and checks the KV caches' integrity whenever it goes idle. step() is
//   sync workflows -> Scheduler::plan (schedule, then apply) -> prefetch / pump transfers ->
//   build_batch -> Backend::forward -> Scheduler::complete_step ->
//   declare fixed prefixes -> sample, detokenize, emit.
//
// EngineImpl wires a few managers, each with one job (constructor):
//   AdapterRegistry  loaded adapters, their slots and users (thread-safe)
//   KvPools          the main + rCache pools, their KvCacheGroup, their host
//                    tiers and the transfer worker, prefetch
//   WorkflowSync     WorkflowRegistry -> the group's agent steps and fixed prefixes
//   StepStats        what a step measured, published once per loop iteration
//   OutputDelivery   the step's outputs, pushed to the streams by a thread of its own
// and keeps the inbox, the Scheduler (rebuilt over the new group whenever
// KvPools reallocates: allocate_pools) and the requests in flight.
//
// Adapters: loaded on the caller's thread (file I/O), then bound to a backend
// slot by a command run on the engine thread; every loaded adapter stays bound
// until unloaded. Each has a KvSharing mode (choose_kv_sharing) that keys its
// requests' KV (engine/request_kv.h); unloading drops every namespace of the
// adapter (kv_namespace_belongs_to_adapter) in every cache, so a later adapter
// with the same name never sees stale K/V.
//
// Outputs: what the engine thread produces for a request is gathered and, right
// after the metrics are published, handed to OutputDelivery, whose thread pushes
// it to its channel (waking the stream's reader off the engine thread); so a
// caller that reads its last output and then take_metrics() sees the request
// counted. When the engine thread exits, everything it produced is in its
// channel before the last commands run.
// KV events (--kv-events-config) go out in the same publish, before the
// outputs: a router has heard of the blocks a request stored by the time its
// client has the response.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "engine/adapter_registry.h"
#include "engine/device_kv_receiver.h"
#include "engine/device_kv_sender.h"
#include "engine/engine.h"
#include "engine/engine_request.h"
#include "engine/kv_pools.h"
#include "engine/output_delivery.h"
#include "engine/request_channel.h"
#include "engine/step_stats.h"
#include "engine/workflow_sync.h"
#include "kv/kv_cache_group.h"
#include "kv/kv_residency.h"
#include "kvevents/kv_event_publisher.h"
#include "scheduler/scheduler.h"
#include "util/worker_pool.h"
#include "workflow/workflow_registry.h"

namespace loom {

class EngineImpl final : public Engine {
 public:
  EngineImpl(LoadedModel model, std::unique_ptr<Backend> backend, EngineConfig config);
  ~EngineImpl() override;

  std::unique_ptr<RequestStream> submit(EngineRequest request) override;
  std::vector<std::unique_ptr<RequestStream>> submit_all(std::vector<EngineRequest> requests) override;
  void load_adapter(const std::string& name, const std::string& path,
                    std::optional<KvSharing> sharing = std::nullopt) override;
  void unload_adapter(const std::string& name) override;
  std::vector<AdapterInfo> adapters() const override { return adapters_.infos(); }
  EngineMetrics take_metrics() override;
  std::vector<KvBlockName> kv_block_hashes(const EngineRequest& request) override;
  bool caches_kv_block(const KvBlockHash& hash) const override;
  DeviceKvReservation reserve_device_kv(const EngineRequest& request, const std::string& peer,
                                        double timeout_seconds) override;
  DeviceKvCancel cancel_device_kv(DeviceKvTransferId id, const std::string& reason) override;
  WorkflowRegistry& workflows() override { return workflows_; }
  const LoadedModel& model() const override { return model_; }
  int32_t max_context_tokens() const override { return max_context_tokens_; }
  void shutdown(bool drain) override;

  // Number of KV blocks the pool was given (derived from kv_cache_bytes when 0).
  int32_t num_kv_blocks() const { return pools_.num_kv_blocks(); }
  // rCache blocks (0 without an rCache pool) and the rank its slots hold.
  int32_t num_residual_kv_blocks() const { return pools_.num_residual_kv_blocks(); }
  int32_t residual_max_rank() const { return pools_.residual_max_rank(); }
  // Runs `command` on the engine thread and waits for it (or runs it here when
  // the thread has exited). Rethrows what it throws. Tests use it to inspect
  // or evict the caches between requests.
  void run_on_engine_thread(const std::function<void()>& command);
  // Engine thread only (inside run_on_engine_thread).
  KvCacheGroup& kv_caches() { return pools_.caches(); }
  KvCacheManager& kv_cache() { return pools_.caches().main(); }
  KvCacheManager* residual_kv_cache() { return pools_.caches().residual(); }

 private:
  // A request that passed submit()'s checks, not queued yet.
  struct CheckedRequest {
    std::unique_ptr<PendingRequest> pending;
    std::optional<AdapterRegistry::ReadyAdapter> adapter;  // when it names one
  };
  // Every check of submit() but the queue's; throws as submit() does.
  CheckedRequest check_request(EngineRequest request);

  // ---- engine_loop.cc: the thread, its inbox and the requests' ends ----
  struct InboxBatch {
    std::deque<std::unique_ptr<PendingRequest>> new_requests;
    std::deque<std::function<void()>> commands;
    bool stopping = false, drain = false;
  };
  void thread_main();
  // Waits while there is nothing to do (checking integrity once per idle
  // spell, once it lasted a second), then takes what the inbox holds.
  InboxBatch take_inbox();
  void check_integrity_once();
  void admit(std::unique_ptr<PendingRequest> request);
  // Device-to-device KV (DE): polls the transfers, admits the requests whose transfer settled, ends cancelled parked ones.
  void poll_device_kv();
  // Ends a request that is not (or no longer) in the scheduler.
  void end_unscheduled(std::unique_ptr<PendingRequest> request, RequestOutput final_output);
  void handle_cancellations();
  void end_request(int64_t id, RequestOutput final_output);
  void fail_all(const Error& error);
  // Queues an output; publish() pushes it.
  void emit(PendingRequest& request, RequestOutput output);
  // Measures the gauges, publishes them and step_stats_ under one lock, sends
  // the KV events gathered since the last call, then pushes the queued
  // outputs. Once per loop iteration, and wherever a caller waits on the
  // engine thread for a change in the metrics.
  void publish();
  EngineGauges measure_gauges() const;

  // ---- engine_step.cc: one step and its parts ----
  void step();
  // Host tier: starts or ends the load waits of the batch's requests.
  void note_load_waits(const ScheduledBatch& scheduled, SteadyTime now);
  // First scheduling and prefix hits of the batch's requests.
  void note_scheduled(const ScheduledBatch& scheduled, SteadyTime scheduled_at);
  Batch build_step_batch(const ScheduledBatch& scheduled) const;
  // Backend::forward; on failure, ends the batch's requests with the error and returns nullopt.
  std::optional<ForwardResult> forward(const ScheduledBatch& scheduled);
  // Starts computing the structured-output masks of the rows that sample this
  // step (PendingRequest::prepare_constraint_mask) on host_workers().
  WorkerPool::Job start_constraint_masks(const ScheduledBatch& scheduled);
  // The per-step host work's threads (masks, host sampling, grammar steps), made at first use.
  WorkerPool& host_workers();
  void fail_batch(const ScheduledBatch& scheduled, const Error& error);
  // Samples (or takes the device-sampled token of) every row that samples, and emits the outputs.
  void sample_and_emit(const ScheduledBatch& scheduled, const ForwardResult& result);
  void on_token(int64_t id, RequestOutput output, SteadyTime now);

  // ---- engine_adapters.cc: pools and adapters on the engine thread ----
  // Destroys the scheduler (which must hold no request), reallocates the
  // pools to `layout`, builds a new scheduler over them and resets WorkflowSync.
  // If the backend refuses them, reallocates the previous layout (when there
  // was one) before rethrowing, so the engine keeps serving.
  void allocate_pools(const KvPoolLayout& layout);
  // A scheduler over pools_.caches(); resets WorkflowSync to the new group.
  void rebuild_scheduler();
  // Makes sure the rCache pool can hold a forked adapter of k/v rank `kv_rank`,
  // resizing while no request was admitted yet; else throws with a hint.
  void prepare_forked_adapter(const std::string& name, int32_t kv_rank);

  LoadedModel model_;
  std::unique_ptr<Backend> backend_;  // outlives pools_
  const EngineConfig config_;
  const BackendCapabilities capabilities_;  // the backend's, read once
  WorkflowRegistry workflows_;  // thread-safe; outlives the engine thread
  int32_t max_context_tokens_ = 0;
  std::vector<TokenId> eos_ids_;
  AdapterRegistry adapters_;

  // Engine thread only (the constructor before the thread starts).
  std::unique_ptr<KvEventPublisher> kv_events_;  // null without --kv-events-config; outlives pools_
  std::unique_ptr<KvResidency> residency_;       // with a KV store (the KV link asks it); outlives pools_
  KvPools pools_;
  std::unique_ptr<Scheduler> scheduler_;  // over pools_.caches(); declared after pools_, destroyed first
  // With EngineConfig::device_kv_plane: the PE's and DE's halves of device-to-device
  // KV transfers (the receiver's leases are over pools_: declared after it).
  std::unique_ptr<DeviceKvSender> kv_sender_;
  std::unique_ptr<DeviceKvReceiver> kv_receiver_;
  WorkflowSync workflow_sync_;
  StepStats step_stats_;
  ActiveRequests active_;
  std::unique_ptr<WorkerPool> host_workers_;
  std::vector<uint32_t> mask_words_;  // the step's device token masks (finish_forward's), reused between steps
  OutputDelivery outputs_;  // emit()'s outputs, pushed to the streams after each publish()
  bool any_request_admitted_ = false;  // pools are fixed from then on
  bool idle_checked_ = false;

  std::shared_ptr<EngineInbox> inbox_ = std::make_shared<EngineInbox>();
  std::atomic<int64_t> next_id_{1};
  std::atomic<int32_t> num_in_inbox_{0};          // submitted, not yet seen by the engine thread
  std::atomic<int32_t> num_scheduler_waiting_{0};  // in the scheduler's waiting queue

  std::mutex metrics_mutex_;
  EngineMetrics metrics_;

  std::mutex shutdown_mutex_;
  std::thread thread_;
};

}  // namespace loom
