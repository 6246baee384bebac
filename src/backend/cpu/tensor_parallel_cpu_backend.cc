#include "backend/cpu/tensor_parallel_cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>

#include "backend/batch_checks.h"
#include "lora/adapter_shard.h"
#include "util/error.h"

namespace loom::cpu {

namespace {

int32_t checked_size(const ModelConfig& config, int32_t size) {
  check_tensor_parallel_size(config, size);
  return size;
}

}  // namespace

TensorParallelCpuBackend::TensorParallelCpuBackend(const ModelConfig& config,
                                                   std::shared_ptr<const ModelWeights> weights,
                                                   const CpuBackendConfig& backend_config)
    : config_(config),
      group_(checked_size(config, backend_config.tensor_parallel_size)),
      threads_(static_cast<size_t>(backend_config.tensor_parallel_size)) {
  if (weights == nullptr) fail(ErrorKind::kInvalidArgument, "cpu backend: no weights given");
  validate_weights(*weights, config_);
  const int32_t size = group_.size();
  const int total_threads = backend_config.num_threads > 0 ? backend_config.num_threads : omp_get_max_threads();
  CpuBackendConfig rank_backend = backend_config;
  rank_backend.num_threads = std::max(1, total_threads / size);
  rank_backend.tensor_parallel_size = 1;
  for (int32_t r = 0; r < size; ++r) {
    const TensorParallelShard shard = tensor_parallel_shard(config_, r, size);
    shards_.push_back(shard);
    ranks_.push_back(std::make_unique<CpuBackend>(
        rank_config(config_, shard), std::make_shared<const ModelWeights>(shard_model_weights(config_, *weights, shard)),
        rank_backend, CpuRank{shard, &group_, config_.vocab_size}));
  }
}

void TensorParallelCpuBackend::run_on_ranks(const std::function<void(int32_t)>& fn) {
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
  // The first rank that failed on its own; the others' errors say only that the group ended.
  std::exception_ptr first;
  for (const std::exception_ptr& error : errors) {
    if (error == nullptr) continue;
    if (first == nullptr) first = error;
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      if (e.message().starts_with("tensor-parallel group:")) continue;
      throw;
    } catch (...) {
      throw;
    }
  }
  if (first != nullptr) std::rethrow_exception(first);
}

void TensorParallelCpuBackend::allocate_kv_cache(const KvCacheShape& shape) {
  for (auto& rank : ranks_) rank->allocate_kv_cache(shape);
}

int64_t TensorParallelCpuBackend::kv_bytes_per_token() const {
  int64_t bytes = 0;
  for (const auto& rank : ranks_) bytes += rank->kv_bytes_per_token();
  return bytes;
}

void TensorParallelCpuBackend::allocate_residual_cache(const ResidualCacheShape& shape) {
  for (auto& rank : ranks_) rank->allocate_residual_cache(shape);
}

int64_t TensorParallelCpuBackend::residual_bytes_per_token(int32_t max_rank) const {
  return static_cast<int64_t>(ranks_.size()) * ranks_[0]->residual_bytes_per_token(max_rank);
}

void TensorParallelCpuBackend::allocate_host_kv_cache(KvPoolKind pool, int32_t num_blocks) {
  const bool is_main = pool == KvPoolKind::kMain;
  CpuBackend& first = *ranks_[0];
  if (first.num_device_blocks(pool) <= 0)
    fail(ErrorKind::kInvalidArgument, "cpu backend: host {} pool before its device pool was allocated",
         is_main ? "KV" : "residual");
  const int32_t arrays_per_rank = static_cast<int32_t>(first.device_arrays(pool).size());
  HostKvPool& host = is_main ? host_main_pool_ : host_residual_pool_;
  host.allocate(num_blocks, is_main ? arrays_per_rank * static_cast<int32_t>(ranks_.size()) : arrays_per_rank,
                first.device_floats_per_block(pool), is_main ? "host KV pool" : "host residual pool");
}

void TensorParallelCpuBackend::copy_kv_blocks(KvPoolKind pool, KvCopyDirection direction,
                                              std::span<const int32_t> device_block_ids,
                                              std::span<const int32_t> host_block_ids) {
  const bool is_main = pool == KvPoolKind::kMain;
  const HostKvPool& host = host_pool(pool);
  CpuBackend& first = *ranks_[0];
  if (host.num_blocks() == 0)
    fail(ErrorKind::kInvalidArgument, "cpu backend: copy of {} blocks with no host {} pool allocated",
         device_block_ids.size(), is_main ? "KV" : "residual");
  if (host.floats_per_block() != first.device_floats_per_block(pool))
    fail(ErrorKind::kInvalidArgument,
         "cpu backend: host {} pool has blocks of {} floats per array, the device pool {}; reallocate it",
         is_main ? "KV" : "residual", host.floats_per_block(), first.device_floats_per_block(pool));
  if (is_main) {
    std::vector<float*> arrays;
    for (auto& rank : ranks_)
      for (float* array : rank->device_arrays(pool)) arrays.push_back(array);
    host.copy(direction, arrays, first.num_device_blocks(pool), device_block_ids, host_block_ids);
  } else if (direction == KvCopyDirection::kDeviceToHost) {
    host.copy(direction, first.device_arrays(pool), first.num_device_blocks(pool), device_block_ids, host_block_ids);
  } else {
    for (auto& rank : ranks_)
      host.copy(direction, rank->device_arrays(pool), rank->num_device_blocks(pool), device_block_ids,
                host_block_ids);
  }
}

void TensorParallelCpuBackend::set_adapter(int32_t slot, std::shared_ptr<const LoraAdapter> adapter) {
  if (adapter != nullptr) validate_adapter(*adapter, config_);
  for (size_t r = 0; r < ranks_.size(); ++r)
    ranks_[r]->set_adapter(slot, adapter == nullptr ? nullptr : shard_lora_adapter(*adapter, config_, shards_[r]));
}

ForwardResult TensorParallelCpuBackend::forward(const Batch& batch) {
  std::vector<ForwardResult> parts(ranks_.size());
  run_on_ranks([&](int32_t r) { parts[r] = ranks_[r]->forward(batch); });
  ForwardResult result = std::move(parts[0]);
  const int64_t num_rows = static_cast<int64_t>(result.logit_token_index.size());
  const int64_t vocab = config_.vocab_size;
  std::vector<float> logits(num_rows * vocab);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const std::vector<float>& slice = r == 0 ? result.logits : parts[r].logits;
    const int64_t width = shards_[r].vocab_slice();
    for (int64_t row = 0; row < num_rows; ++row)
      std::memcpy(logits.data() + row * vocab + shards_[r].vocab_begin, slice.data() + row * width,
                  width * sizeof(float));
  }
  result.logits = std::move(logits);
  result.vocab_size = config_.vocab_size;
  return result;
}

BackendCapabilities TensorParallelCpuBackend::capabilities() const {
  BackendCapabilities capabilities = ranks_[0]->capabilities();
  capabilities.tensor_parallel_size = static_cast<int32_t>(ranks_.size());
  return capabilities;
}

}  // namespace loom::cpu
