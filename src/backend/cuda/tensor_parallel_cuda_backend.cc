#include "backend/cuda/tensor_parallel_cuda_backend.h"

#include <functional>

#include <fmt/format.h>

#include "backend/batch_checks.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/host_kv_tier.h"
#include "util/error.h"

namespace loom::cuda {

namespace {

const char* pool_name(KvPoolKind pool) { return pool == KvPoolKind::kMain ? "KV" : "residual"; }

// The group's host tier (backend.h "Host tier"): one pinned arena per pool
// kind. A main host block is every rank's block one after the other (rank 0's
// per-layer K and V, then rank 1's, ...), as the CPU group lays it out; a
// residual host block is rank 0's rCache block (every rank holds the same) and
// is loaded back into every rank. Rank r copies its part through a HostKvTier
// view on its own device; the ranks' copies run at once.
class TensorParallelCudaBackend final : public TensorParallelBackend {
 public:
  using TensorParallelBackend::TensorParallelBackend;
  ~TensorParallelCudaBackend() override {
    for (auto& views : views_) views.clear();  // their streams end before the arenas go
    for (void*& arena : arenas_)
      if (arena != nullptr) cudaFreeHost(arena);
  }

  BackendCapabilities capabilities() const override {
    BackendCapabilities capabilities = TensorParallelBackend::capabilities();
    // On the logits each rank gathers (vocab_gather.h), as on one GPU.
    capabilities.device_sampling = cuda_rank(0).tuning().tensor_parallel_vocab_gather;
    capabilities.host_kv_tier = true;
    capabilities.residual_host_kv_tier = true;
    return capabilities;
  }

  void allocate_host_kv_cache(KvPoolKind pool, int32_t num_blocks) override {
    const int kind = static_cast<int>(pool);
    const DeviceKvPools& first = cuda_rank(0).kv_pools();
    if (first.device_pool(pool).num_blocks <= 0)
      fail(ErrorKind::kInvalidArgument, "cuda backend: host {} pool before its device pool was allocated",
           pool_name(pool));
    if (num_blocks < 0) fail(ErrorKind::kInvalidArgument, "cuda backend: host {} pool of {} blocks", pool_name(pool), num_blocks);
    views_[kind].clear();
    if (arenas_[kind] != nullptr) cudaFreeHost(arenas_[kind]);
    arenas_[kind] = nullptr;
    num_blocks_[kind] = 0;
    const bool is_main = pool == KvPoolKind::kMain;
    const size_t rank_bytes = static_cast<size_t>(first.num_arrays(pool)) * first.device_bytes_per_block(pool);
    host_block_bytes_[kind] = is_main ? rank_bytes * size() : rank_bytes;
    const size_t bytes = host_block_bytes_[kind] * static_cast<size_t>(num_blocks);
    if (bytes > 0) {
      LOOM_CUDA_CHECK(cudaSetDevice(cuda_rank(0).device()));
      // Portable: every rank's device copies from and to it.
      if (cudaHostAlloc(&arenas_[kind], bytes, cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        arenas_[kind] = nullptr;
        throw Error(ErrorKind::kCapacity,
                    fmt::format("cuda backend: cannot pin {} bytes of host memory for a host {} pool of {} blocks",
                                bytes, pool_name(pool), num_blocks),
                    "lower --host-kv-memory");
      }
    }
    for (int32_t r = 0; r < size(); ++r) {
      const DeviceKvPools& pools = cuda_rank(r).kv_pools();
      auto view = std::make_unique<HostKvTier>(cuda_rank(r).device());
      std::byte* part = static_cast<std::byte*>(arenas_[kind]) + (is_main && bytes > 0 ? r * rank_bytes : 0);
      view->attach(bytes > 0 ? part : nullptr, num_blocks, pools.num_arrays(pool), pools.device_bytes_per_block(pool),
                   host_block_bytes_[kind]);
      views_[kind].push_back(std::move(view));
    }
    num_blocks_[kind] = num_blocks;
  }

  int32_t num_host_kv_blocks(KvPoolKind pool) const override { return num_blocks_[static_cast<int>(pool)]; }

  std::span<std::byte> host_kv_block(KvPoolKind pool, int32_t host_block_id) override {
    const int kind = static_cast<int>(pool);
    if (host_block_id < 0 || host_block_id >= num_blocks_[kind])
      fail(ErrorKind::kInvalidArgument, "cuda backend: host {} block {} out of range [0, {})", pool_name(pool),
           host_block_id, num_blocks_[kind]);
    return {static_cast<std::byte*>(arenas_[kind]) + static_cast<size_t>(host_block_id) * host_block_bytes_[kind],
            host_block_bytes_[kind]};
  }

  void copy_kv_blocks(KvPoolKind pool, KvCopyDirection direction, std::span<const int32_t> device_block_ids,
                      std::span<const int32_t> host_block_ids) override {
    const int kind = static_cast<int>(pool);
    if (num_blocks_[kind] == 0)
      fail(ErrorKind::kInvalidArgument, "cuda backend: copy of {} blocks with no host {} pool allocated",
           device_block_ids.size(), pool_name(pool));
    // The device pools may have been reallocated with another block size (or rank) since.
    const size_t device_bytes = cuda_rank(0).kv_pools().device_bytes_per_block(pool);
    if (views_[kind][0]->bytes_per_block() != device_bytes)
      fail(ErrorKind::kInvalidArgument,
           "cuda backend: host {} pool has blocks of {} bytes per array, the device pool {}; reallocate it",
           pool_name(pool), views_[kind][0]->bytes_per_block(), device_bytes);
    // An rCache block is the same on every rank: offloaded from rank 0, loaded into all.
    const int32_t ranks = pool == KvPoolKind::kResidual && direction == KvCopyDirection::kDeviceToHost ? 1 : size();
    for (int32_t r = 0; r < ranks; ++r)
      views_[kind][r]->enqueue_copy(direction, cuda_rank(r).kv_pools().device_pool(pool), device_block_ids,
                                    host_block_ids);
    if (device_block_ids.empty()) return;
    for (int32_t r = 0; r < ranks; ++r) views_[kind][r]->finish(direction);
  }

 private:
  CudaBackend& cuda_rank(int32_t r) const { return static_cast<CudaBackend&>(rank(r)); }

  void* arenas_[2] = {nullptr, nullptr};  // [KvPoolKind], pinned, portable
  size_t host_block_bytes_[2] = {0, 0};
  int32_t num_blocks_[2] = {0, 0};
  std::vector<std::unique_ptr<HostKvTier>> views_[2];  // [KvPoolKind][rank]
};

// The group of ranks, rank r made by make_rank(its backend config: device, shard, communicator).
std::unique_ptr<Backend> make_group(const ModelConfig& config, const CudaBackendConfig& backend_config,
                                    std::span<const int> devices, std::span<DeviceCommunicator* const> communicators,
                                    TensorParallelGroup group,
                                    const std::function<std::unique_ptr<Backend>(const CudaBackendConfig&)>& make_rank) {
  const int32_t size = static_cast<int32_t>(devices.size());
  check_tensor_parallel_size(config, size);
  LOOM_CHECK(communicators.size() == devices.size());
  std::vector<TensorParallelShard> shards;
  std::vector<std::unique_ptr<Backend>> ranks;
  for (int32_t r = 0; r < size; ++r) {
    shards.push_back(tensor_parallel_shard(config, r, size));
    CudaBackendConfig rank_backend = backend_config;
    rank_backend.device = devices[r];
    rank_backend.rank = {shards[r], communicators[r], config.vocab_size};
    ranks.push_back(make_rank(rank_backend));
  }
  return std::make_unique<TensorParallelCudaBackend>(config, std::move(shards), std::move(ranks), std::move(group));
}

}  // namespace

std::unique_ptr<Backend> make_tensor_parallel_cuda_backend(const ModelConfig& config, const ModelWeights& weights,
                                                           const CudaBackendConfig& backend_config,
                                                           std::span<const int> devices,
                                                           std::span<DeviceCommunicator* const> communicators,
                                                           TensorParallelGroup group) {
  validate_weights(weights, config);
  return make_group(config, backend_config, devices, communicators, std::move(group),
                    [&](const CudaBackendConfig& rank_backend) {
                      const TensorParallelShard& shard = rank_backend.rank.shard;
                      return make_cuda_backend(rank_config(config, shard), shard_model_weights(config, weights, shard),
                                               rank_backend);
                    });
}

std::unique_ptr<Backend> make_synthetic_tensor_parallel_cuda_backend(
    const ModelConfig& config, uint64_t seed, bool round_to_bf16, const CudaBackendConfig& backend_config,
    std::span<const int> devices, std::span<DeviceCommunicator* const> communicators, TensorParallelGroup group) {
  return make_group(config, backend_config, devices, communicators, std::move(group),
                    [&](const CudaBackendConfig& rank_backend) -> std::unique_ptr<Backend> {
                      return make_synthetic_cuda_backend_impl(config, seed, round_to_bf16, rank_backend);
                    });
}

}  // namespace loom::cuda
