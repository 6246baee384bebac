// Tensor parallelism on the CPU: N CpuBackend ranks (cpu_backend_impl.h), one
// thread each, over the shards of model/tensor_parallel.h and adapters cut by
// lora/adapter_shard.h, joined by an InProcessGroup's all-reduces. The same
// sharding the GPU ranks run, here so that CI checks it gives the whole
// model's logits (to fp32 rounding: partial sums are added in another order).
//
// The KV pools are sharded by kv head: each rank holds its kv heads' K and V.
// The rCache of forked sharing holds x A^T with A whole, so every rank keeps the
// same entries. Host tier: a host main block is the ranks' blocks one after the
// other (rank 0's per-layer K and V, then rank 1's, ...), a host rCache block is
// rank 0's (loaded back into every rank). capabilities().tensor_parallel_size
// enters the blocks' content-hash salt, so a TP=N block is never read by an
// engine of another size.
//
// Threads: forward() runs the ranks on its own worker threads and returns when
// all are done; a rank that throws aborts the group's collectives, so the
// others throw too, and forward() rethrows the first rank's own error.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_backend_impl.h"
#include "backend/cpu/host_kv_pool.h"
#include "backend/cpu/in_process_group.h"
#include "model/tensor_parallel.h"
#include "util/worker_pool.h"

namespace loom::cpu {

class TensorParallelCpuBackend final : public Backend {
 public:
  // backend_config.tensor_parallel_size ranks (check_tensor_parallel_size's rules).
  TensorParallelCpuBackend(const ModelConfig& config, std::shared_ptr<const ModelWeights> weights,
                           const CpuBackendConfig& backend_config);

  void allocate_kv_cache(const KvCacheShape& shape) override;
  KvCacheShape kv_cache_shape() const override { return ranks_[0]->kv_cache_shape(); }
  int64_t kv_bytes_per_token() const override;
  void allocate_residual_cache(const ResidualCacheShape& shape) override;
  ResidualCacheShape residual_cache_shape() const override { return ranks_[0]->residual_cache_shape(); }
  int64_t residual_bytes_per_token(int32_t max_rank) const override;
  void allocate_host_kv_cache(KvPoolKind pool, int32_t num_blocks) override;
  int32_t num_host_kv_blocks(KvPoolKind pool) const override { return host_pool(pool).num_blocks(); }
  std::span<std::byte> host_kv_block(KvPoolKind pool, int32_t host_block_id) override {
    return host_pool(pool).block_bytes(host_block_id);
  }
  void copy_kv_blocks(KvPoolKind pool, KvCopyDirection direction, std::span<const int32_t> device_block_ids,
                      std::span<const int32_t> host_block_ids) override;
  void set_adapter(int32_t slot, std::shared_ptr<const LoraAdapter> adapter) override;
  int32_t max_adapter_slots() const override { return ranks_[0]->max_adapter_slots(); }
  ForwardResult forward(const Batch& batch) override;
  BackendCapabilities capabilities() const override;

 private:
  const HostKvPool& host_pool(KvPoolKind pool) const {
    return pool == KvPoolKind::kMain ? host_main_pool_ : host_residual_pool_;
  }
  // Runs fn(rank) on every rank at once; rethrows the lowest failing rank's error.
  void run_on_ranks(const std::function<void(int32_t)>& fn);

  const ModelConfig config_;  // the whole model
  std::vector<TensorParallelShard> shards_;
  InProcessGroup group_;
  std::vector<std::unique_ptr<CpuBackend>> ranks_;  // ranks_[r] joins group_ as rank r
  WorkerPool threads_;                               // one per rank
  HostKvPool host_main_pool_;      // arrays: rank 0's per-layer K, V, then rank 1's, ...
  HostKvPool host_residual_pool_;  // arrays: rank 0's per-layer rCache
};

}  // namespace loom::cpu
