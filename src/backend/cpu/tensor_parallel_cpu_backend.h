// Tensor parallelism on the CPU (docs/tensor-parallel.md): N CpuBackend ranks
// (cpu_backend_impl.h), a thread each, joined by an InProcessGroup, run by
// TensorParallelBackend. The same sharding the GPU ranks run, so that CI
// checks it gives the whole model's logits (to fp32 rounding: partial sums are
// added in another order).
//
// Host tier: a host main block is the ranks' blocks one after the other (rank
// 0's per-layer K and V, then rank 1's, ...); a host rCache block is rank 0's
// (every rank holds the same rCache entries) and is loaded back into every rank.
#pragma once

#include <memory>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/host_kv_pool.h"
#include "backend/tensor_parallel_backend.h"

namespace loom::cpu {

class CpuBackend;

class TensorParallelCpuBackend final : public TensorParallelBackend {
 public:
  using TensorParallelBackend::TensorParallelBackend;
  // backend_config.tensor_parallel_size ranks (check_tensor_parallel_size's
  // rules); fp32 weights only (Error(kUnsupported) otherwise).
  static std::unique_ptr<Backend> make(const ModelConfig& config, std::shared_ptr<const ModelWeights> weights,
                                       const CpuBackendConfig& backend_config);

  void allocate_host_kv_cache(KvPoolKind pool, int32_t num_blocks) override;
  int32_t num_host_kv_blocks(KvPoolKind pool) const override { return host_pool(pool).num_blocks(); }
  std::span<std::byte> host_kv_block(KvPoolKind pool, int32_t host_block_id) override {
    return host_pool(pool).block_bytes(host_block_id);
  }
  void copy_kv_blocks(KvPoolKind pool, KvCopyDirection direction, std::span<const int32_t> device_block_ids,
                      std::span<const int32_t> host_block_ids) override;
  BackendCapabilities capabilities() const override;

 private:
  const HostKvPool& host_pool(KvPoolKind pool) const {
    return pool == KvPoolKind::kMain ? host_main_pool_ : host_residual_pool_;
  }
  CpuBackend& cpu_rank(int32_t r) const;

  HostKvPool host_main_pool_;      // arrays: rank 0's per-layer K, V, then rank 1's, ...
  HostKvPool host_residual_pool_;  // arrays: rank 0's per-layer rCache
};

}  // namespace loom::cpu
