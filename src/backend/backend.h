// The compute backend interface: a ragged batch of sequences in, logits out,
// K/V read and written through per-sequence block tables.
//
// Who calls it: the engine thread only (backends are not thread-safe).
// What it owns: KV tensors and whatever device copies of weights/adapters it
// needs. Block metadata (which block holds what) lives on the host, in kv/;
// the backend just reads/writes the slots the batch names.
//
// KV addressing. Each layer has a K and a V pool of num_blocks x block_size
// slots, each slot num_kv_heads x head_dim floats. Token j of a sequence (0-based
// index in that sequence's KV, i.e. j < num_computed_tokens + num_new_tokens)
// lives in slot  block_table[j / block_size] * block_size + j % block_size.
//
//   sequence s:  |<----- num_computed_tokens ----->|<-- num_new_tokens -->|
//                 already in KV (read only)          written this step, queries
//   block_table:  [b0][b1]...[bk]  covers all num_computed_tokens + num_new_tokens
//
// New token i of sequence s attends to KV entries 0 .. num_computed_tokens + i (causal).
//
// KV sharing modes (docs/design.md §1) show up in the batch as:
//   activated  per-token adapter_slots: -1 before the invocation start, the
//              adapter's slot from it on. Nothing else.
//   base       decoder_adapter_slot >= 0: the sequence's tokens run as base rows
//              (adapter_slots -1; they write K/V), and each token that gives
//              logits also runs as a decoder row (base + the adapter's LoRA on
//              q, o, gate, up, down; never k/v) that attends to the same K/V
//              (its own position's entry is the base row's) and writes nothing.
//              The logits row comes from the decoder row.
//   forked     forked_adapter_slot >= 0 (== the tokens' adapter_slots): the main
//              pool holds the bCache (RoPE(x·W_k), x·W_v, no LoRA on k/v) and the
//              residual pool the rCache (x·A_k, x·A_v of that adapter).
//              Attention uses K = bK + RoPE(s_k·rK·B_k^T), V = bV + s_v·rV·B_v^T
//              (ResidualAttention: reconstructed per tile, V's up-projection after
//              the loop). Cached entry j has RoPE position j.
// Write masks: the main entries [0, num_kv_present_tokens) and residual entries
// [0, num_residual_present_tokens) already hold data (possibly shared with other
// sequences) and are read, never written, even where they overlap new tokens.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend_capabilities.h"
#include "util/cache_gauge.h"

namespace loom {

struct LoraAdapter;

// Device-to-device KV transfer (docs/disaggregation.md "Device to device"):
// when a step's KV is being streamed to another engine, the backend tells a
// listener as each layer's K/V (and rCache) writes of the step are issued.
//
// KvLayerFence: when the layer's writes are complete. CPU: already (event is
// null). CUDA: a cudaEvent_t recorded on the compute stream right after the
// layer's KV writes; the listener (the data plane) makes its copy stream wait
// on it, so nothing blocks the compute stream. The event belongs to the
// backend and stays valid until the step's finish_forward returns; a step
// with a listener runs without CUDA graphs (recording per-layer events into a
// replayed graph would pin the listener's identity into the capture).
// A tensor-parallel group tells its listener once per layer, when every rank
// has written it, with each rank's event (TensorParallelBackend joins them).
struct KvLayerFence {
  static constexpr int32_t kMaxRanks = 8;
  void* event = nullptr;  // a single backend's (or one rank's) event; null: written already
  int32_t rank = 0;       // the tensor-parallel rank that wrote it (0 alone)
  // A group's fence: rank r's event in rank_events[r] for r < num_ranks (`event` unused); 0: not a group's.
  int32_t num_ranks = 0;
  std::array<void*, kMaxRanks> rank_events{};
};

// Thread: called on the thread running the forward (the engine thread), in
// layer order, once per layer of a step whose Batch::kv_layer_listener is set.
// Must not throw; must return quickly (it may only enqueue work).
class KvLayerListener {
 public:
  virtual ~KvLayerListener() = default;
  virtual void layer_written(int32_t layer, const KvLayerFence& fence) = 0;
};

// Where a pool's KV lives, for a data plane that moves blocks between two
// engines' pools without the backend (kvtransfer/device/). Every array holds
// num_blocks blocks of bytes_per_block bytes back to back: block b of an
// array starts at base + b * bytes_per_block.
//   main pool:   per layer, K then V (2 arrays per layer)
//   rCache pool: per layer, one array
struct KvPoolMemory {
  enum class Kind : uint8_t { kHost, kCuda };
  Kind kind = Kind::kHost;
  int32_t device = -1;  // kCuda: the ordinal in this process
  int32_t arrays_per_layer = 0;
  int32_t num_blocks = 0;
  int64_t bytes_per_block = 0;  // of one array
  std::vector<std::byte*> arrays;  // [layer * arrays_per_layer + i]
  // A tensor-parallel group's pools: num_ranks ranks, each with arrays_per_layer
  // / num_ranks arrays per layer, a layer's arrays rank after rank (rank r's on
  // devices[r]); every array's block holds that rank's shard of the block.
  int32_t num_ranks = 1;
  std::vector<int32_t> devices;  // [rank], kCuda (empty: `device` alone)
  // [rank]: the one allocation each rank's arrays lie in (kCuda: its pool's
  // cudaMalloc, which a peer process maps by its IPC handle); empty where the
  // backend does not say.
  std::vector<std::byte*> allocations;

  int32_t rank_of_array(size_t index) const {
    return static_cast<int32_t>(index % static_cast<size_t>(arrays_per_layer)) / (arrays_per_layer / num_ranks);
  }

  int32_t num_layers() const { return arrays_per_layer == 0 ? 0 : static_cast<int32_t>(arrays.size()) / arrays_per_layer; }
  bool empty() const { return arrays.empty(); }
};

struct BatchSequence {
  int32_t num_computed_tokens = 0;  // KV entries already written by earlier steps
  int32_t num_new_tokens = 0;       // tokens of this sequence in Batch::token_ids
  int32_t token_offset = 0;         // index of its first new token in Batch::token_ids
  int32_t block_table_offset = 0;   // index of its first block id in Batch::block_tables
  int32_t num_blocks = 0;           // >= ceil((num_computed_tokens + num_new_tokens) / block_size)
  bool logits_for_all_tokens = false;  // false: logits for the last new token only

  int32_t num_kv_present_tokens = 0;        // see "Write masks" above; 0 = write all new tokens
  int32_t decoder_adapter_slot = -1;        // >= 0: base (ICaRus) sharing with this adapter
  int32_t forked_adapter_slot = -1;         // >= 0: forked (ForkKV) sharing with this adapter
  int32_t residual_block_table_offset = 0;  // forked: first rCache block id in Batch::residual_block_tables
  int32_t num_residual_blocks = 0;          // forked: >= ceil((computed + new) / block_size)
  int32_t num_residual_present_tokens = 0;
};

// Sampling on the device (only where capabilities().device_sampling): the
// backend draws a sequence's next token from its logits row itself and returns
// the token id instead of the row. Semantics follow engine/sampler.h: greedy
// (argmax, lowest id on ties) when temperature is 0 or top_k is 1; otherwise
// the top_k highest logits (ties: lower id first), then the smallest prefix of
// those, by descending logit, whose softmax(logits / temperature) mass reaches
// top_p, renormalised. The random draw comes from a counter-based generator
// (Philox4x32-10) keyed by (seed, step): the same logits, seed and step give
// the same token wherever the sequence sits in whatever batch. (The host
// Sampler draws from its own stream, so host and device draws differ.)
struct DeviceSampling {
  bool on_device = false;    // false: the sequence's logits row comes back as usual
  float temperature = 0.0f;  // >= 0; 0: greedy
  int32_t top_k = 0;         // >= 0; 0: no limit
  float top_p = 1.0f;        // (0, 1]; 1: no nucleus cut
  uint64_t seed = 0;
  uint64_t step = 0;         // e.g. the number of tokens the request generated so far
  // >= 0 (capabilities().device_token_masks only): before drawing, logits of the
  // tokens whose bit is clear in row mask_row of finish_forward's token masks
  // become -inf (structured outputs). The logprob is then under the masked logits.
  int32_t mask_row = -1;
  // Logit processing (capabilities().device_logit_processing only), after the
  // mask: Batch::logit_edits [edits_begin, edits_begin + num_edits) (penalties,
  // logit_bias), then, when temperature > 0, min_p: tokens whose probability is
  // below min_p times the most likely one's become -inf. The logprob stays under
  // the logits before this processing (engine/sampler.h's raw logprob).
  float repetition_penalty = 1.0f;  // > 0, for LogitEdit::repeated
  float min_p = 0.0f;               // [0, 1]
  int32_t edits_begin = 0, num_edits = 0;
};

// One token's logit processing (engine/sampler.h's order): logit' = rep(logit +
// bias) - subtract, where rep divides a positive logit by the row's
// repetition_penalty and multiplies a negative one, if `repeated`. At most one
// edit per token per sequence.
struct LogitEdit {
  int32_t token = 0;
  float bias = 0.0f;
  float subtract = 0.0f;
  int32_t repeated = 0;
};

struct Batch {
  std::vector<int32_t> token_ids;      // [num_tokens], sequences back to back
  std::vector<int32_t> positions;      // [num_tokens], RoPE positions
  // [num_tokens]: adapter slot applied to each token, -1 = base model. Per token,
  // not per sequence, so that activated LoRA can switch mid-sequence.
  std::vector<int32_t> adapter_slots;
  std::vector<BatchSequence> sequences;
  std::vector<int32_t> block_tables;   // concatenated block ids
  std::vector<int32_t> residual_block_tables;  // concatenated rCache block ids (forked sequences)
  // Fill ForwardResult::hidden_states (divergence tooling; slow).
  bool capture_hidden_states = false;
  // Empty, or one entry per sequence (capabilities().device_sampling only).
  // A sequence sampled on the device must not ask for logits_for_all_tokens.
  std::vector<DeviceSampling> sampling;
  // Rows of token masks the step's DeviceSampling::mask_row index
  // (capabilities().device_token_masks): finish_forward's argument.
  int32_t num_token_mask_rows = 0;
  // DeviceSampling::edits_begin / num_edits index this.
  std::vector<LogitEdit> logit_edits;
  // Set (capabilities().kv_layer_notifications only) when some sequence's KV
  // is being streamed to another engine this step: told as each layer's KV
  // writes are issued. Borrowed; null (the rule) costs nothing.
  KvLayerListener* kv_layer_listener = nullptr;

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
};

struct ForwardResult {
  // Row r holds the logits for token logit_token_index[r] of the batch.
  // Rows follow batch order: per sequence, its last token (or all of its tokens).
  std::vector<float> logits;              // [num_rows, vocab_size]
  std::vector<int32_t> logit_token_index; // [num_rows]
  int32_t vocab_size = 0;
  // When Batch::capture_hidden_states: [num_layers + 1][num_rows][hidden_size],
  // the residual stream of each logits row (its decoder row in base sharing)
  // after the embedding (0) and after each layer (1..num_layers), before the final norm.
  std::vector<float> hidden_states;
  // When Batch::sampling is not empty: per row, the token drawn on the device
  // (-1 for rows of sequences not sampled there) and its logprob under the raw
  // logits (log-softmax, as Sampler reports it). `logits` then holds only the
  // rows whose sampled_token_ids entry is -1, in row order.
  std::vector<int32_t> sampled_token_ids;  // [num_rows]
  std::vector<float> sampled_logprobs;     // [num_rows]
};

// The rCache pool: per layer num_blocks x block_size slots of 2 * max_rank
// values ([rK: max_rank][rV: max_rank]; an adapter of rank r < max_rank uses the
// first r of each half).
struct ResidualCacheShape {
  int32_t num_blocks = 0;
  int32_t block_size = 16;
  int32_t max_rank = 0;
};

enum class KvPoolKind : uint8_t { kMain, kResidual };
enum class KvCopyDirection : uint8_t { kDeviceToHost, kHostToDevice };

struct KvCacheShape {
  int32_t num_blocks = 0;
  int32_t block_size = 16;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // (Re)allocates the KV pools; previous contents are lost.
  virtual void allocate_kv_cache(const KvCacheShape& shape) = 0;
  virtual KvCacheShape kv_cache_shape() const = 0;
  // Bytes one KV slot takes across all layers (K and V), for capacity planning.
  virtual int64_t kv_bytes_per_token() const = 0;

  // (Re)allocates the rCache pool for forked sharing; previous contents are lost.
  // Throws Error(kUnsupported) where the backend has no forked sharing.
  virtual void allocate_residual_cache(const ResidualCacheShape& shape);
  virtual ResidualCacheShape residual_cache_shape() const { return {0, 0, 0}; }
  // Bytes one rCache slot takes across all layers for this max rank.
  virtual int64_t residual_bytes_per_token(int32_t max_rank) const;

  // ---- Host tier of the KV cache (kv/host_tier_planner.h) ----
  // A second pool of num_blocks blocks in host memory holding exactly what a
  // device block holds (every layer's K and V slots of the block, or the rCache
  // slots for KvPoolKind::kResidual). The CPU backend keeps a second arena; the
  // CUDA backend pinned host memory copied on its own stream.
  // (Re)allocates it; previous host contents are lost. Throws
  // Error(kUnsupported) where the backend has none, Error(kCapacity) when the
  // memory cannot be had. Engine thread, with no copy in flight.
  virtual void allocate_host_kv_cache(KvPoolKind pool, int32_t num_blocks);
  virtual int32_t num_host_kv_blocks(KvPoolKind /*pool*/) const { return 0; }
  // Copies whole blocks: device block device_block_ids[i] to host block
  // host_block_ids[i] (kDeviceToHost) or back, and returns when the data has
  // landed. Throws Error on a bad id or a failed copy (the caller treats the
  // transfer as failed).
  // Thread: any thread, at most one call per direction at a time, concurrently
  // with forward() on the engine thread. The caller (KvCacheManager states)
  // guarantees that no block a copy writes is read or written by a concurrent
  // forward, and no block it reads is written by one. Never concurrently with
  // allocate_kv_cache / allocate_residual_cache / allocate_host_kv_cache.
  virtual void copy_kv_blocks(KvPoolKind pool, KvCopyDirection direction, std::span<const int32_t> device_block_ids,
                              std::span<const int32_t> host_block_ids);

  // The bytes of host block host_block_id of `pool` (all its arrays, as
  // copy_kv_blocks lays them out): what the disk tier writes and reads back
  // verbatim. Valid until the host pool is reallocated. Thread: any; the
  // caller (KvCacheManager states) guarantees no copy writes the block meanwhile,
  // and the block is not read by a copy while the caller writes it. Throws
  // Error(kInvalidArgument) on a bad id, Error(kUnsupported) without a host tier.
  virtual std::span<std::byte> host_kv_block(KvPoolKind pool, int32_t host_block_id);

  // Where `pool`'s device KV lives (KvPoolMemory above), for a device-to-device
  // data plane; valid until that pool is reallocated. Throws Error(kUnsupported)
  // where the backend has no kv_layer_notifications. Engine thread.
  virtual KvPoolMemory kv_pool_memory(KvPoolKind pool);

  // Binds an adapter to a slot (0 <= slot < max_adapter_slots()); nullptr frees it.
  // The backend keeps the shared_ptr while bound.
  virtual void set_adapter(int32_t slot, std::shared_ptr<const LoraAdapter> adapter) = 0;
  virtual int32_t max_adapter_slots() const = 0;

  // Runs the model over the batch, writing K/V of the new tokens into their
  // slots. Preconditions: every block id < num_blocks; adapter slots bound; no
  // token mask rows (those need the two phases below).
  virtual ForwardResult forward(const Batch& batch) = 0;

  // The same step in two phases, so that the caller's host work overlaps the
  // device's. enqueue_forward starts the model's work and may return before it
  // ends; finish_forward then takes the step's token masks (Batch::
  // num_token_mask_rows rows of ceil(vocab_size / 32) words, row-major; bit
  // t % 32 of word t / 32 set = token t allowed; read during the call only),
  // draws and returns what forward() would. One finish per enqueue, on the
  // engine thread; the batch must stay alive and unchanged until the finish
  // returns. An enqueue with no finish after it (its caller failed) is
  // abandoned by the next enqueue. The defaults (for backends without device
  // token masks) run forward() in the finish.
  virtual void enqueue_forward(const Batch& batch);
  virtual ForwardResult finish_forward(std::span<const uint32_t> token_masks);

  // What forward() and the host tier run (backend_capabilities.h). The engine
  // refuses, when the engine is built or an adapter is loaded, whatever is not
  // declared here; forward() still checks as a defence. Any thread; constant
  // for the backend's lifetime.
  virtual BackendCapabilities capabilities() const = 0;

  // The backend's own host-side caches (e.g. captured CUDA graphs, GEMM
  // algorithms by shape), each within its documented limit, for /metrics.
  // Engine thread, between forward() calls.
  virtual std::vector<CacheGauge> cache_gauges() const { return {}; }

  // capabilities().device_sampling: forward() honours Batch::sampling
  // (DeviceSampling above); other backends ignore it and return logits.
  bool supports_device_sampling() const { return capabilities().device_sampling; }

 private:
  const Batch* enqueued_ = nullptr;  // the default enqueue_forward's batch, until its finish
};

}  // namespace loom
