// The serving engine: one engine thread runs scheduler -> cache manager ->
// batch builder -> Backend::forward -> sampler -> detokenizer, and streams
// results back to whoever submitted each request (HTTP worker threads).
//
// Threads: submit / cancel / adapter calls / metrics are safe from any thread;
// the backend, scheduler and cache manager are touched by the engine thread only.
// Ownership: the engine owns the backend and the loaded model; callers own the
// RequestStream they get back (dropping it cancels the request).
//
// The contract between the server (src/server) and the engine: both sides
// code against this header.
#pragma once

#include <chrono>
#include <map>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/generation_result.h"
#include "engine/sampler.h"
#include "grammar/compiled_grammar.h"
#include "kv/kv_block_hash.h"
#include "kvevents/kv_events_config.h"
#include "kvtransfer/device/device_kv_plane.h"
#include "lora/kv_sharing.h"
#include "model/loader.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "workflow/workflow_registry.h"

namespace loom {

class DiskKvStore;

struct EngineConfig {
  int32_t block_size = 16;
  int32_t num_kv_blocks = 0;           // 0: derived from kv_cache_bytes
  int64_t kv_cache_bytes = 1ll << 30;  // KV pool size when num_kv_blocks == 0
  int32_t max_batch_tokens = 2048;     // --max-batch-tokens: tokens per forward step
  int32_t max_running_requests = 64;   // --max-running-requests
  int32_t max_waiting_requests = 1024; // beyond this, submit() fails with kCapacity (HTTP 503)
  int32_t max_loras_per_batch = 8;     // --max-loras-per-batch
  int32_t max_adapter_slots = 64;      // adapters loaded at once
  int32_t max_context_tokens = 0;      // 0: the model's max_position_embeddings
  // --kv-cache-dtype: the KV pools' element type (backend_capabilities.h). fp8
  // needs BackendCapabilities::fp8_kv_cache (checked when the engine is built)
  // and enters every KV block's content-hash salt, so blocks of another dtype
  // are never read back from the host/disk tiers, another engine or KV events.
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;
  // --quantization fp8: the backend quantizes the model's 16-bit weights to FP8
  // at load (the CLI sets both from the flag). The host weights the model
  // fingerprint samples are the 16-bit ones, so this enters the model's
  // identity (kv_identity.h): blocks computed with FP8 weights never share a
  // name with the 16-bit model's.
  bool fp8_weights = false;
  // Mode for adapters whose mode nobody chose (--default-sharing; see choose_kv_sharing).
  KvSharing default_sharing = KvSharing::kIsolated;
  // Modes the operator forbids (--disable-kv-sharing MODE[,MODE], e.g. the
  // lossy base). Adapters may use the backend's modes (Backend::capabilities())
  // less these; others are refused when loaded, and a default_sharing outside
  // them makes the engine's construction fail (engine/backend_support.h).
  std::vector<KvSharing> disabled_kv_sharing;
  // rCache pool for forked adapters, taken out of kv_cache_bytes: -1 = auto
  // (kv_cache_bytes / 8 when a forked adapter is loaded at start or
  // default_sharing is forked, else 0); 0 = none (loading a forked adapter then
  // fails with a hint).
  int64_t residual_kv_cache_bytes = -1;
  // Largest LoRA rank (k/v) a forked adapter may have; 0 = the largest among the
  // adapters loaded at start, at least 16 (--max-lora-rank).
  int32_t max_lora_rank = 0;
  // --eviction-policy lru|workflow: KVFlow steps-to-execution eviction when true.
  bool workflow_aware_eviction = false;
  // Workflows not seen for this long are forgotten (--workflow-ttl-seconds).
  double workflow_ttl_seconds = 600.0;
  // Workflows the registry knows at once (--max-workflows): a new one beyond
  // gets 503 on PUT; requests naming one are served without workflow tracking.
  int32_t max_workflows = 10000;
  // Agents one workflow graph may have, declared or named in `after` lists
  // (--max-workflow-agents; so also the predecessors of one agent), and
  // entries in each list of a progress update. Beyond: 400 naming the field.
  int32_t max_workflow_agents = 256;
  // Host tier of the KV pools (--host-kv-memory): bytes of host memory that
  // back up evicted blocks (0 = none), shared by the main pool and, when there
  // is one and the backend can (BackendCapabilities::residual_host_kv_tier),
  // the forked rCache pool, which gets host_residual_kv_cache_bytes of it
  // (--host-residual-kv-memory): -1 = auto, its share of the device pools'
  // bytes, so that each pool's host tier is the same multiple of its device
  // pool; 0 = no rCache host tier. num_host_kv_blocks > 0 sets the main host
  // pool's block count exactly instead (tests); the rCache's is then
  // num_host_residual_kv_blocks when > 0, else that same multiple of its pool
  // (none when host_residual_kv_cache_bytes is 0).
  int64_t host_kv_cache_bytes = 0;
  int64_t host_residual_kv_cache_bytes = -1;
  int32_t num_host_kv_blocks = 0;
  int32_t num_host_residual_kv_blocks = 0;
  // Proactive prefetch from the host tier (--prefetch-agents, --prefetch-max-bytes):
  // each step, the fixed prefixes of up to this many agents closest to running
  // (smallest steps-to-execution, >= 1) are loaded back when they sit on the host,
  // at most prefetch_max_bytes in flight (0 = no limit but the pool). 0 agents = off.
  int32_t prefetch_agents = 2;
  int64_t prefetch_max_bytes = 0;
  // --host-load-policy blocking|background (scheduler.h policy 6, HostLoadPolicy): false =
  // background (a request whose prefix loads from the host waits while others run); true =
  // blocking (it holds its place and the step waits for its load: HiCache's load-back, the
  // KVFlow paper's baseline).
  bool blocking_host_loads = false;
  // --preemption-mode recompute|swap (scheduler.h policies 4 and 9, PreemptionMode):
  // false = recompute; true = swap (a preempted request's private blocks go to
  // the host tier and it keeps its progress; needs a host tier, else recomputes).
  bool swap_preemption = false;
  // Disk / shared-storage tier below the host tier (--disk-kv-path DIR,
  // --disk-kv-bytes N, --disk-kv-warm-start, --disk-kv-read-bandwidth B/s):
  // content-addressed block files in DIR (kvstore/disk_kv_store.h) that
  // several servers may share. "" = none. Needs a host tier (the host pool
  // stages every read and write) and disk_kv_bytes > 0. Blocks reach it by
  // write-through when they are backed up to the host; requests whose prefix
  // continues there read it back disk -> host -> device (scheduler policy 7).
  std::string disk_kv_path;
  int64_t disk_kv_bytes = 0;
  bool disk_kv_warm_start = false;
  int64_t disk_kv_read_bandwidth = 0;  // bytes/s; 0 = unpaced
  // A store to use as the disk tier instead of opening disk_kv_path: a
  // disaggregated engine's BufferedKvStore (kvstore/buffered_kv_store.h),
  // which the server's KV transfer routes share. Same rules: needs a host tier.
  std::shared_ptr<DiskKvStore> kv_store;
  // KV events for KV-aware routers (--kv-events-config, vLLM's): when enabled,
  // every block stored in or removed from a tier of any KV cache is published
  // over ZMQ, one batch per engine loop iteration (kvevents/kv_event_publisher.h).
  KvEventsConfig kv_events;
  // Transfers queued per direction (loads, backups) before new ones are refused
  // (a refused backup is skipped, a refused load recomputes).
  int32_t max_queued_kv_transfers = 64;
  // When there is an rCache pool, exactly this many blocks (tests, `loom
  // generate`) instead of residual_kv_cache_bytes' worth; 0: derived from it.
  // Whether there is one still follows residual_kv_cache_bytes.
  int32_t num_residual_kv_blocks = 0;
  // The device-to-device KV data plane (kvtransfer/device/device_kv_plane.h;
  // docs/disaggregation.md "Device to device"): null, the default, leaves the
  // engine with the staged path only. Needs BackendCapabilities::
  // kv_layer_notifications (checked when the engine is built). Shared: the
  // server reports its endpoint.
  std::shared_ptr<DeviceKvPlane> device_kv_plane;
  // "At start" above means: before the first request is submitted. Until then,
  // loading a forked adapter (re)sizes both pools (contents are lost; there are
  // none yet); afterwards a forked adapter that does not fit the pools fails.
};

// A KV block as a transfer names it: its content hash and payload bytes.
struct KvBlockName {
  KvBlockHash hash;
  int64_t bytes = 0;
};

// PE side of a device-to-device transfer: the prompt's full blocks from
// first_block on stream, layer by layer as the prefill writes them, into the
// DE's reservation (Engine::reserve_device_kv) at `peer` (its plane endpoint's
// address). Blocks already cached here go at once.
struct DeviceKvSend {
  std::string peer;
  DeviceKvDestination destination;  // the reservation's
  int32_t first_block = 0;          // the reservation's: prompt block of transfer block 0
};

// DE side: what reserve_device_kv set aside for one request.
struct DeviceKvReservation {
  DeviceKvDestination destination;  // transfer block i = prompt block first_block + i
  int32_t first_block = 0;          // prompt blocks [0, first_block) the DE holds already (leased too)
  int32_t num_layers = 0;
};

// DE side: what Engine::cancel_device_kv found.
enum class DeviceKvCancel {
  kCancelled,  // it was in flight: failed now, its fresh blocks freed, its request recomputes
  kSettled,    // it had landed or failed already: nothing changed
  kUnknown,    // no reservation of that id here (never made, or released since)
};

struct EngineRequest {
  std::vector<TokenId> prompt_tokens;  // non-empty
  std::string adapter;                 // "" = base model; else a loaded adapter's name
  SamplingParams sampling;
  int32_t max_new_tokens = 16;
  int32_t min_new_tokens = 0;          // EOS and stop strings are ignored before this many tokens
  std::vector<std::string> stop_strings;
  std::vector<TokenId> stop_token_ids; // in addition to the tokenizer's EOS ids
  bool ignore_eos = false;
  bool include_stop_str_in_output = false;  // a matched stop string ends the text instead of being cut
  bool skip_special_tokens = true;          // special tokens' text left out of the output text
  int32_t priority = 0;                // lower runs first (vLLM convention); FCFS within a priority
  // Workflow hints (KVFlow, docs/design.md §2): agent names are scoped by workflow. Empty = none.
  std::string workflow;
  std::string agent;
  std::optional<int32_t> fixed_prefix_tokens;  // explicit end of the agent's fixed prompt part
  // Structured output (grammar/constraint_compiler.h; compiled on the HTTP
  // handler thread, shared read-only; null: unconstrained). Every sampled token
  // is one the grammar allows; EOS only where it may end; the request finishes
  // with kStop once nothing but the end is possible. Such requests sample on the host.
  std::shared_ptr<const grammar::CompiledGrammar> constraint;
  // With a constraint: it governs only the tokens after the output's text
  // first contains this (a reasoning model's "</think>": vLLM's reasoning +
  // structured output, the grammar shapes the answer, not the thinking); until
  // then sampling is free and EOS ends the request. "" = from the first token.
  // Read on each token's raw bytes (special tokens' text included).
  std::string constraint_after;
  // Disaggregation over the device-to-device path (DeviceKvSend above). On a
  // DE: the transfer (from reserve_device_kv) this request waits for; it is
  // admitted once the transfer landed (its blocks are then a prefix hit) or
  // failed (it recomputes). An id the engine does not know is ignored.
  std::optional<DeviceKvTransferId> device_kv_receive;
  // On a PE: stream the prompt's KV to a DE while prefilling it.
  std::optional<DeviceKvSend> device_kv_send;
};

// One message from the engine about a request. Text never splits a UTF-8
// character and never contains (a prefix of) a stop string still being matched.
struct RequestOutput {
  std::vector<SampledToken> new_tokens;  // tokens produced since the last output
  std::string text_delta;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kLength;  // valid when finished
  std::optional<Error> error;            // set (and finished) when the request failed
  int32_t num_prompt_tokens = 0;
  int32_t num_cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
  int32_t num_output_tokens = 0;         // total so far
};

// The receiving end of one request. Not thread-safe: one consumer.
class RequestStream {
 public:
  virtual ~RequestStream() = default;  // cancels the request if not finished
  // Blocks until the next output, or until `timeout` passes (returns nullopt).
  // After an output with finished == true, returns nullopt forever.
  virtual std::optional<RequestOutput> next(std::chrono::milliseconds timeout) = 0;
  // Cancels the request: its blocks are freed by the engine thread soon after.
  virtual void cancel() = 0;
  virtual const std::string& request_id() const = 0;
};

struct AdapterInfo {
  std::string name;
  std::string path;
  int32_t rank = 0;
  int32_t num_running_requests = 0;
  KvSharing sharing = KvSharing::kIsolated;
};

// Point-in-time numbers for /metrics and /health.
struct EngineMetrics {
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int64_t kv_blocks_total = 0, kv_blocks_free = 0, kv_blocks_cached = 0, kv_blocks_in_use = 0;
  int64_t kv_bytes_in_use_or_cached = 0;  // kv_bytes_base + kv_bytes_residual
  int64_t prefix_queried_tokens = 0, prefix_hit_tokens = 0;   // totals since start
  // The same split by the request's mode: "none" (base model), "isolated",
  // "activated", "base", "forked".
  std::map<std::string, int64_t> prefix_queried_tokens_by_mode, prefix_hit_tokens_by_mode;
  // Bytes held now (in use or cached) in the main pool ("base" kind: every
  // namespace of the main pool) and in the rCache pool ("residual").
  int64_t kv_bytes_base = 0, kv_bytes_residual = 0;
  // Per adapter: bytes of its own namespaces (lora/, alora/...@, resid/); every
  // loaded adapter has an entry (0 when it holds nothing).
  std::map<std::string, int64_t> kv_bytes_by_adapter;
  // Bytes one token takes across all layers: a main-pool K/V slot, an rCache
  // slot (0 without an rCache pool). Their ratio is ForkKV's per-agent saving.
  int64_t kv_bytes_per_token_base = 0, kv_bytes_per_token_residual = 0;
  // The rCache pool's blocks (all 0 without one); free + cached + in use = total.
  int64_t residual_blocks_total = 0, residual_blocks_free = 0, residual_blocks_cached = 0, residual_blocks_in_use = 0;
  int64_t num_preemptions = 0, num_evicted_tokens = 0;        // totals since start
  // Of num_preemptions, those that swapped (--preemption-mode swap); swaps
  // that became recomputes (no host room, a lost copy or prefix); tokens of
  // private blocks copied to the host and back (finished copies).
  int64_t num_swap_preemptions = 0, num_swap_fallbacks = 0;
  int64_t num_swapped_out_tokens = 0, num_swapped_in_tokens = 0;
  // Host tier (all 0 without one). Bytes held now, in the main pool's host
  // tier ("base" kind) and the rCache's ("residual"); token counters since
  // start, over both (a forked request's prefix counts once per pool it moves in).
  int64_t kv_bytes_host = 0, kv_bytes_host_residual = 0;
  // Host blocks of each pool's tier (total 0: that pool has no host tier) and
  // those holding something (valid backups and offloads in flight).
  int64_t host_blocks_total = 0, host_blocks_used = 0;
  int64_t residual_host_blocks_total = 0, residual_host_blocks_used = 0;
  int64_t num_offloaded_tokens = 0, num_loaded_tokens = 0, num_prefetched_tokens = 0;
  // Prefetched tokens a request then found ready ("in time") or still loading ("late").
  int64_t num_prefetch_hit_tokens = 0, num_prefetch_late_tokens = 0;
  int64_t num_failed_kv_transfers = 0;
  // Device-to-device transfers (engine/device_kv_receiver.h, device_kv_sender.h),
  // since start: received whole; failed or timed out at the receiver (the
  // request recomputed); sent whole; abandoned by the sender.
  int64_t num_device_kv_received = 0, num_device_kv_receive_failures = 0, num_device_kv_cancelled = 0;
  int64_t num_device_kv_sent = 0, num_device_kv_send_failures = 0;
  int64_t device_kv_received_blocks = 0;
  int64_t device_kv_quarantined_blocks = 0;  // gauge: held back from a failed transfer whose peer may still write
  // Samples (seconds) since the previous call: a reservation to its every layer landed; a receiving
  // request's wait for its transfer (device_kv_receiver.h Timings).
  std::vector<double> device_kv_transfer_time, device_kv_wait_time;
  // Disk tier (all 0 without one): blocks and bytes its directory holds as this
  // process knows it; since start: blocks stored, blocks read back into the
  // host tier (tokens: num_disk_loaded_tokens), failed reads and writes,
  // payload bytes read and the seconds spent reading them.
  int64_t disk_blocks = 0, disk_bytes = 0, disk_capacity_bytes = 0;
  int64_t num_disk_stored_blocks = 0, num_disk_loaded_tokens = 0, num_disk_read_failures = 0,
          num_disk_write_failures = 0, disk_read_bytes = 0;
  double disk_read_seconds = 0;
  int32_t num_waiting_on_load = 0;  // requests held back last step because their prefix was loading
  std::vector<double> load_wait_time;  // seconds each admitted request waited on loads (only those that did)
  int64_t num_prompt_tokens = 0, num_generated_tokens = 0;    // totals since start
  // Requests ended since start, by vLLM's finished_reason: "stop", "length",
  // "abort" (cancelled by the client, or by a shutdown that does not drain),
  // "error" (the engine failed it); engine/step_stats.h's
  // finished_reason_label. A reason no request ended with has no entry.
  std::map<std::string, int64_t> num_finished_requests_by_reason;
  // Workflows the registry knows now (declared, progressed or seen in a request
  // within the TTL), and the eviction policy ("lru" or "workflow").
  int32_t num_workflows_active = 0;
  std::string eviction_policy = "lru";
  // The backend's bounded host caches (Backend::cache_gauges), as of the last step.
  std::vector<CacheGauge> backend_caches;
  // Latency samples (seconds) taken since the previous call; the caller
  // accumulates them into histograms.
  std::vector<double> time_to_first_token, inter_token, end_to_end, queue_time, prefill_time, decode_time;
  std::vector<int32_t> decode_batch_sizes;
};

class Engine {
 public:
  virtual ~Engine() = default;

  // Queues a request. Throws Error(kNotFound) for an unknown adapter,
  // Error(kCapacity) when prompt + max_new_tokens exceeds the context or the
  // waiting queue is full, Error(kInvalidArgument) for bad sampling params,
  // Error(kUnavailable) once shutdown() began. A request cancelled later ends
  // with Error(kCancelled); one still running when shutdown(false) ends it, with
  // Error(kUnavailable).
  virtual std::unique_ptr<RequestStream> submit(EngineRequest request) = 0;
  // Queues every request of `requests` or none of them (one HTTP request's
  // choices and prompts): each is checked as submit() checks it, and the
  // waiting queue must take them all at once (kCapacity otherwise), so a
  // refused fan-out leaves nothing queued that a later request would queue
  // behind. Streams in the order of `requests`.
  virtual std::vector<std::unique_ptr<RequestStream>> submit_all(std::vector<EngineRequest> requests) = 0;

  // loom::Error on failure. `sharing` overrides the adapter's own choice (see
  // choose_kv_sharing); check_kv_sharing's errors are thrown, its warning logged.
  // A mode or rank the backend does not run, or a mode the operator disabled,
  // is refused with Error(kUnsupported) (engine/backend_support.h).
  virtual void load_adapter(const std::string& name, const std::string& path,
                            std::optional<KvSharing> sharing = std::nullopt) = 0;
  // Refused with Error(kInvalidArgument) while requests use it.
  virtual void unload_adapter(const std::string& name) = 0;
  virtual std::vector<AdapterInfo> adapters() const = 0;

  virtual EngineMetrics take_metrics() = 0;
  // The full blocks `request`'s prompt fills, in every KV cache it uses (main
  // first, then the rCache), named as the engine names them (content hashes,
  // kv/kv_block_hash.h) with their payload bytes: what a KV transfer between
  // engines moves. Empty when the engine names no blocks (no disk tier, no KV
  // store, no KV events). Throws Error(kNotFound) for an unknown adapter. Any thread.
  virtual std::vector<KvBlockName> kv_block_hashes(const EngineRequest& request) {
    (void)request;
    return {};
  }
  // Whether the engine's caches hold the block named `hash` (device or host
  // tier) right now; tracked only with a KV store (EngineConfig::kv_store),
  // false otherwise. Any thread; the answer may be stale a moment later.
  virtual bool caches_kv_block(const KvBlockHash& hash) const {
    (void)hash;
    return false;
  }
  // DE side of a device-to-device transfer: reserves device blocks for the
  // full blocks of `request`'s prompt that this engine does not cache (main
  // pool and, forked, the rCache), allocated and leased so nothing evicts or
  // reuses them, and tells the plane to expect them from `peer` within
  // `timeout_seconds`. They join the radix trees only once every layer
  // landed; on failure or timeout they are freed. A reservation no request
  // claims (device_kv_receive) within the timeout is freed too. Throws
  // Error(kUnsupported) without a plane, kCapacity when the blocks cannot be
  // had now, kNotFound for an unknown adapter. Any thread.
  virtual DeviceKvReservation reserve_device_kv(const EngineRequest& request, const std::string& peer,
                                                double timeout_seconds) {
    (void)request, (void)peer, (void)timeout_seconds;
    throw Error(ErrorKind::kUnsupported, "this engine has no device-to-device KV plane");
  }
  // DE side: the PE side of transfer `id` failed after the reservation (the
  // prefill failed, refused the send): fail it now rather than at its
  // deadline. Nothing more lands in its blocks (the plane's transfer is
  // finished), the fresh ones go back to the free list, and its request,
  // parked or still to come, recomputes at once. A transfer whose every
  // layer landed already is committed as usual (kSettled), never discarded.
  // `reason` goes to the log. Throws Error(kUnsupported) without a plane.
  // Any thread.
  virtual DeviceKvCancel cancel_device_kv(DeviceKvTransferId id, const std::string& reason) {
    (void)id, (void)reason;
    throw Error(ErrorKind::kUnsupported, "this engine has no device-to-device KV plane");
  }
  // The workflow registry (thread-safe; the HTTP routes of /v1/workflows call it directly).
  virtual WorkflowRegistry& workflows() {
    throw Error(ErrorKind::kUnsupported, "this engine has no workflow registry");
  }
  virtual const LoadedModel& model() const = 0;
  virtual int32_t max_context_tokens() const = 0;

  // Stops taking requests; cancels (drain = false) or finishes (drain = true)
  // those in flight, then joins the engine thread. Idempotent.
  virtual void shutdown(bool drain) = 0;
};

// Starts the engine thread. Throws Error(kUnsupported) when the backend cannot
// run the model or the config (check_engine_supported), e.g. a default sharing
// it lacks.
std::unique_ptr<Engine> make_engine(LoadedModel model, std::unique_ptr<Backend> backend, EngineConfig config);

}  // namespace loom
