#include "backend/cuda/tensor_parallel_cuda_backend.h"

#include "backend/batch_checks.h"
#include "util/error.h"

namespace loom::cuda {

std::unique_ptr<Backend> make_tensor_parallel_cuda_backend(const ModelConfig& config, const ModelWeights& weights,
                                                           const CudaBackendConfig& backend_config,
                                                           std::span<const int> devices,
                                                           std::span<DeviceCommunicator* const> communicators,
                                                           TensorParallelGroup group) {
  const int32_t size = static_cast<int32_t>(devices.size());
  check_tensor_parallel_size(config, size);
  LOOM_CHECK(communicators.size() == devices.size());
  validate_weights(weights, config);
  std::vector<TensorParallelShard> shards;
  std::vector<std::unique_ptr<Backend>> ranks;
  for (int32_t r = 0; r < size; ++r) {
    shards.push_back(tensor_parallel_shard(config, r, size));
    CudaBackendConfig rank_backend = backend_config;
    rank_backend.device = devices[r];
    rank_backend.rank = {shards[r], communicators[r], config.vocab_size};
    ranks.push_back(
        make_cuda_backend(rank_config(config, shards[r]), shard_model_weights(config, weights, shards[r]), rank_backend));
  }
  return std::make_unique<TensorParallelBackend>(config, std::move(shards), std::move(ranks), std::move(group));
}

}  // namespace loom::cuda
