#include "backend/tensor_parallel_backend.h"

#include <cstring>
#include <exception>
#include <mutex>

#include "backend/batch_checks.h"
#include "lora/adapter_shard.h"
#include "util/error.h"

namespace loom {

TensorParallelBackend::TensorParallelBackend(const ModelConfig& config, std::vector<TensorParallelShard> shards,
                                             std::vector<std::unique_ptr<Backend>> ranks, TensorParallelGroup group)
    : config_(config),
      shards_(std::move(shards)),
      group_(std::move(group)),
      ranks_(std::move(ranks)),
      threads_(std::max<size_t>(1, ranks_.size())) {
  LOOM_CHECK(!ranks_.empty() && ranks_.size() == shards_.size() && group_.abort && group_.reset);
}

TensorParallelBackend::~TensorParallelBackend() = default;

void TensorParallelBackend::run_on_ranks(const std::function<void(int32_t)>& fn) {
  std::vector<std::exception_ptr> errors(ranks_.size());
  group_.reset();
  threads_
      .start(ranks_.size(),
             [&](size_t r) {
               try {
                 fn(static_cast<int32_t>(r));
               } catch (...) {
                 errors[r] = std::current_exception();
                 group_.abort(static_cast<int32_t>(r));
               }
             })
      .wait();
  std::exception_ptr first;
  for (const std::exception_ptr& error : errors) {
    if (error == nullptr) continue;
    if (first == nullptr) first = error;
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      if (!group_.aborted_prefix.empty() && e.message().starts_with(group_.aborted_prefix)) continue;
      throw;
    }
  }
  if (first != nullptr) std::rethrow_exception(first);
}

void TensorParallelBackend::allocate_kv_cache(const KvCacheShape& shape) {
  for (auto& rank : ranks_) rank->allocate_kv_cache(shape);
}

int64_t TensorParallelBackend::kv_bytes_per_token() const {
  int64_t bytes = 0;
  for (const auto& rank : ranks_) bytes += rank->kv_bytes_per_token();
  return bytes;
}

void TensorParallelBackend::allocate_residual_cache(const ResidualCacheShape& shape) {
  for (auto& rank : ranks_) rank->allocate_residual_cache(shape);
}

int64_t TensorParallelBackend::residual_bytes_per_token(int32_t max_rank) const {
  return static_cast<int64_t>(ranks_.size()) * ranks_[0]->residual_bytes_per_token(max_rank);
}

void TensorParallelBackend::set_adapter(int32_t slot, std::shared_ptr<const LoraAdapter> adapter) {
  if (adapter != nullptr) validate_adapter(*adapter, config_);
  for (size_t r = 0; r < ranks_.size(); ++r)
    ranks_[r]->set_adapter(slot, adapter == nullptr ? nullptr : shard_lora_adapter(*adapter, config_, shards_[r]));
}

namespace {

// Tells the step's listener of each layer once every rank has written it, with
// every rank's event (backend.h KvLayerFence). The ranks call in from their own
// threads, each in layer order; the listener is called under the lock, so one
// call at a time, in layer order (a layer's last rank reports it no later than
// the next layer's).
class LayerJoin final : public KvLayerListener {
 public:
  LayerJoin(KvLayerListener& listener, int32_t num_ranks, int32_t num_layers)
      : listener_(listener), num_ranks_(num_ranks), fences_(static_cast<size_t>(num_layers)) {}
  void layer_written(int32_t layer, const KvLayerFence& fence) override {
    std::lock_guard lock(mutex_);
    KvLayerFence& joined = fences_.at(static_cast<size_t>(layer));
    joined.rank_events.at(static_cast<size_t>(fence.rank)) = fence.event;
    if (++joined.num_ranks == num_ranks_) listener_.layer_written(layer, joined);
  }

 private:
  KvLayerListener& listener_;
  const int32_t num_ranks_;
  std::mutex mutex_;
  std::vector<KvLayerFence> fences_;  // [layer]: num_ranks counts the ranks that reported it
};

}  // namespace

ForwardResult TensorParallelBackend::forward(const Batch& batch) {
  std::vector<ForwardResult> parts(ranks_.size());
  if (batch.kv_layer_listener != nullptr) {
    LOOM_CHECK(size() <= KvLayerFence::kMaxRanks);
    LayerJoin join(*batch.kv_layer_listener, size(), config_.num_layers);
    Batch joined = batch;  // the same step, told through the join
    joined.kv_layer_listener = &join;
    run_on_ranks([&](int32_t r) { parts[r] = ranks_[r]->forward(joined); });
    return finish_forward_parts(parts);
  }
  run_on_ranks([&](int32_t r) { parts[r] = ranks_[r]->forward(batch); });
  return finish_forward_parts(parts);
}

ForwardResult TensorParallelBackend::finish_forward_parts(std::vector<ForwardResult>& parts) {
  ForwardResult result = std::move(parts[0]);
  // Ranks that gather the vocabulary themselves (CUDA's VocabGather): rank 0's result is whole.
  if (result.vocab_size == config_.vocab_size) return result;
  const int64_t num_rows = static_cast<int64_t>(result.logit_token_index.size());
  const int64_t vocab = config_.vocab_size;
  std::vector<float> logits(num_rows * vocab);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const std::vector<float>& slice = r == 0 ? result.logits : parts[r].logits;
    const int64_t width = shards_[r].vocab_slice();
    LOOM_CHECK(static_cast<int64_t>(slice.size()) == num_rows * width);
    for (int64_t row = 0; row < num_rows; ++row)
      std::memcpy(logits.data() + row * vocab + shards_[r].vocab_begin, slice.data() + row * width,
                  width * sizeof(float));
  }
  result.logits = std::move(logits);
  result.vocab_size = config_.vocab_size;
  return result;
}

BackendCapabilities TensorParallelBackend::capabilities() const {
  BackendCapabilities capabilities = ranks_[0]->capabilities();
  capabilities.tensor_parallel_size = static_cast<int32_t>(ranks_.size());
  capabilities.device_sampling = false;  // a group that gathers its logits on the device says otherwise
  capabilities.device_token_masks = false;
  capabilities.device_logit_processing = false;
  capabilities.host_kv_tier = false;
  capabilities.residual_host_kv_tier = false;
  // Every rank tells of its layers (with its rank in the fence): forward() joins them into one call per layer.
  capabilities.kv_layer_notifications = ranks_[0]->capabilities().kv_layer_notifications;
  return capabilities;
}

KvPoolMemory TensorParallelBackend::kv_pool_memory(KvPoolKind pool) {
  std::vector<KvPoolMemory> ranks;
  for (auto& rank : ranks_) ranks.push_back(rank->kv_pool_memory(pool));
  KvPoolMemory group = ranks[0];
  group.num_ranks = size();
  group.arrays_per_layer = ranks[0].arrays_per_layer * size();
  group.arrays.clear();
  group.devices.clear();
  group.allocations.clear();
  const int32_t per_rank = ranks[0].arrays_per_layer;
  for (int32_t layer = 0; layer < ranks[0].num_layers(); ++layer)
    for (const KvPoolMemory& rank : ranks) {
      LOOM_CHECK(rank.arrays_per_layer == per_rank && rank.num_blocks == group.num_blocks &&
                 rank.bytes_per_block == group.bytes_per_block);
      for (int32_t a = 0; a < per_rank; ++a) group.arrays.push_back(rank.arrays[layer * per_rank + a]);
    }
  for (const KvPoolMemory& rank : ranks) {
    if (!rank.devices.empty()) group.devices.push_back(rank.devices[0]);
    if (!rank.allocations.empty()) group.allocations.push_back(rank.allocations[0]);
  }
  return group;
}

}  // namespace loom
