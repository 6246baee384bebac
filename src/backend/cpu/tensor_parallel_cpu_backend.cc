#include "backend/cpu/tensor_parallel_cpu_backend.h"

#include <omp.h>

#include <algorithm>

#include "backend/batch_checks.h"
#include "backend/cpu/cpu_backend_impl.h"
#include "backend/cpu/in_process_group.h"
#include "util/error.h"

namespace loom::cpu {

std::unique_ptr<Backend> TensorParallelCpuBackend::make(const ModelConfig& config,
                                                        std::shared_ptr<const ModelWeights> weights,
                                                        const CpuBackendConfig& backend_config) {
  const int32_t size = backend_config.tensor_parallel_size;
  check_tensor_parallel_size(config, size);
  if (weights == nullptr) fail(ErrorKind::kInvalidArgument, "cpu backend: no weights given");
  validate_weights(*weights, config);
  if (has_quantized_tensors(*weights))
    throw Error(ErrorKind::kUnsupported, "cpu backend: tensor parallelism runs fp32 weights",
                "load the model with --cpu-precision fp32");
  auto group = std::make_shared<InProcessGroup>(size);
  const int total_threads = backend_config.num_threads > 0 ? backend_config.num_threads : omp_get_max_threads();
  CpuBackendConfig rank_backend = backend_config;
  rank_backend.num_threads = std::max(1, total_threads / size);
  rank_backend.tensor_parallel_size = 1;
  std::vector<TensorParallelShard> shards;
  std::vector<std::unique_ptr<Backend>> ranks;
  for (int32_t r = 0; r < size; ++r) {
    shards.push_back(tensor_parallel_shard(config, r, size));
    ranks.push_back(std::make_unique<CpuBackend>(
        rank_config(config, shards[r]),
        std::make_shared<const ModelWeights>(shard_model_weights(config, *weights, shards[r])), rank_backend,
        CpuRank{shards[r], group.get(), config.vocab_size}));
  }
  TensorParallelGroup hooks{[group](int32_t failed) { group->abort(failed); }, [group] { group->reset(); }, group,
                            InProcessGroup::kAbortedPrefix};
  return std::unique_ptr<Backend>(
      new TensorParallelCpuBackend(config, std::move(shards), std::move(ranks), std::move(hooks)));
}

CpuBackend& TensorParallelCpuBackend::cpu_rank(int32_t r) const { return static_cast<CpuBackend&>(rank(r)); }

BackendCapabilities TensorParallelCpuBackend::capabilities() const {
  BackendCapabilities capabilities = TensorParallelBackend::capabilities();
  capabilities.host_kv_tier = true;
  capabilities.residual_host_kv_tier = true;
  return capabilities;
}

void TensorParallelCpuBackend::allocate_host_kv_cache(KvPoolKind pool, int32_t num_blocks) {
  const bool is_main = pool == KvPoolKind::kMain;
  CpuBackend& first = cpu_rank(0);
  const int32_t arrays_per_rank = static_cast<int32_t>(first.kv_pools().device_arrays(pool).size());
  HostKvPool& host = is_main ? host_main_pool_ : host_residual_pool_;
  host.allocate(num_blocks, first.kv_pools().num_device_blocks(pool), is_main ? arrays_per_rank * size() : arrays_per_rank,
                first.kv_pools().device_floats_per_block(pool), is_main ? "host KV pool" : "host residual pool");
}

void TensorParallelCpuBackend::copy_kv_blocks(KvPoolKind pool, KvCopyDirection direction,
                                              std::span<const int32_t> device_block_ids,
                                              std::span<const int32_t> host_block_ids) {
  const bool is_main = pool == KvPoolKind::kMain;
  const HostKvPool& host = host_pool(pool);
  CpuBackend& first = cpu_rank(0);
  host.check_copyable(first.kv_pools().device_floats_per_block(pool), device_block_ids.size());
  if (is_main) {
    std::vector<float*> arrays;
    for (int32_t r = 0; r < size(); ++r)
      for (float* array : cpu_rank(r).kv_pools().device_arrays(pool)) arrays.push_back(array);
    host.copy(direction, arrays, first.kv_pools().num_device_blocks(pool), device_block_ids, host_block_ids);
  } else if (direction == KvCopyDirection::kDeviceToHost) {
    host.copy(direction, first.kv_pools().device_arrays(pool), first.kv_pools().num_device_blocks(pool), device_block_ids, host_block_ids);
  } else {
    for (int32_t r = 0; r < size(); ++r)
      host.copy(direction, cpu_rank(r).kv_pools().device_arrays(pool), cpu_rank(r).kv_pools().num_device_blocks(pool), device_block_ids,
                host_block_ids);
  }
}

}  // namespace loom::cpu
