#include "backend/cuda/device_kv_pools.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/plan_types.h"
#include "util/error.h"

namespace loom::cuda {

namespace {

// Allocates `bytes` into `buffer`, turning the allocator's failure into
// Error(kCapacity) that says what the memory was for and how to ask for less.
void allocate_or_explain(DeviceBuffer& buffer, size_t bytes, const std::string& what, const char* hint) {
  try {
    buffer.allocate(bytes);
  } catch (const Error& error) {
    throw Error(ErrorKind::kCapacity,
                fmt::format("cuda backend: cannot allocate {} of {} bytes: {}", what, bytes, error.message()), hint);
  }
}

}  // namespace

DeviceKvPools::DeviceKvPools(const ModelConfig& config, int device, int32_t forked_wide_prefill_keys,
                             KvCacheDtype kv_dtype)
    : config_(config), device_(device), kv_dtype_(kv_dtype),
      forked_wide_prefill_keys_(std::max(forked_wide_prefill_keys, 0)) {}

void DeviceKvPools::set_fp8_scales(std::vector<float> k_scales, std::vector<float> v_scales) {
  const auto layers = static_cast<size_t>(config_.num_layers);
  if ((!k_scales.empty() && k_scales.size() != layers) || k_scales.size() != v_scales.size())
    fail(ErrorKind::kInvalidArgument, "cuda backend: {} k and {} v KV cache scales for {} layers", k_scales.size(),
         v_scales.size(), layers);
  for (size_t l = 0; l < k_scales.size(); ++l)
    if (!(k_scales[l] > 0.0f && v_scales[l] > 0.0f))
      fail(ErrorKind::kInvalidArgument, "cuda backend: layer {}'s KV cache scales {} / {} must be > 0", l, k_scales[l],
           v_scales[l]);
  k_scales_ = std::move(k_scales);
  v_scales_ = std::move(v_scales);
}

int64_t DeviceKvPools::main_bytes_per_token() const {
  return static_cast<int64_t>(config_.num_layers) * 2 * config_.kv_size() * main_element_bytes();
}

int64_t DeviceKvPools::residual_bytes_per_token(int32_t max_rank) const {
  return static_cast<int64_t>(config_.num_layers) * 2 * cuda::residual_rank_stride(max_rank) *
         static_cast<int64_t>(sizeof(__nv_bfloat16));
}

void DeviceKvPools::allocate_main(const KvCacheShape& shape, cudaStream_t stream) {
  if (shape.num_blocks <= 0 || shape.block_size <= 0)
    fail(ErrorKind::kInvalidArgument, "cuda backend: KV cache of {} blocks of {} tokens", shape.num_blocks,
         shape.block_size);
  main_.release();
  main_shape_ = {0, 0};
  const int64_t bytes = static_cast<int64_t>(shape.num_blocks) * shape.block_size * main_bytes_per_token();
  allocate_or_explain(main_, static_cast<size_t>(bytes), fmt::format("a KV cache ({} blocks)", shape.num_blocks),
                      "lower --kv-cache-bytes");
  LOOM_CUDA_CHECK(cudaMemsetAsync(main_.data(), 0, main_.size(), stream));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  main_shape_ = shape;
}

void DeviceKvPools::allocate_residual(const ResidualCacheShape& shape, cudaStream_t stream) {
  if (shape.num_blocks <= 0 || shape.block_size <= 0 || shape.max_rank <= 0)
    fail(ErrorKind::kInvalidArgument, "cuda backend: residual cache of {} blocks of {} tokens, max rank {}",
         shape.num_blocks, shape.block_size, shape.max_rank);
  if (shape.max_rank > kResidualMaxRank)
    throw Error(ErrorKind::kUnsupported,
                fmt::format("cuda backend: residual cache of max rank {} (ResidualAttention runs k/v ranks up to {})",
                            shape.max_rank, kResidualMaxRank),
                fmt::format("serve forked adapters of k/v rank <= {}, or use --device cpu", kResidualMaxRank));
  residual_.release();
  residual_shape_ = {0, 0, 0};
  residual_rank_stride_ = 0;
  const int64_t bytes =
      static_cast<int64_t>(shape.num_blocks) * shape.block_size * residual_bytes_per_token(shape.max_rank);
  allocate_or_explain(residual_, static_cast<size_t>(bytes),
                      fmt::format("a residual cache ({} blocks)", shape.num_blocks), "lower --residual-kv-cache-memory");
  LOOM_CUDA_CHECK(cudaMemsetAsync(residual_.data(), 0, residual_.size(), stream));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  residual_shape_ = shape;
  residual_rank_stride_ = cuda::residual_rank_stride(shape.max_rank);
  // Taken here, beside the rCache, so that a step never allocates it when the
  // KV pools have filled the GPU.
  const size_t scratch_bytes =
      2 * static_cast<size_t>(forked_wide_prefill_keys_) * config_.kv_size() * sizeof(__nv_bfloat16);
  if (scratch_.size() < scratch_bytes)
    allocate_or_explain(scratch_, scratch_bytes, "forked prefill scratch",
                        "lower --residual-kv-cache-memory or the KV cache's share of GPU memory");
}

int64_t DeviceKvPools::scratch_keys() const {
  return static_cast<int64_t>(scratch_.size() / (2 * config_.kv_size() * sizeof(__nv_bfloat16)));
}

std::byte* DeviceKvPools::main_array(int64_t index) const {
  if (main_.data() == nullptr) return nullptr;
  const int64_t bytes = static_cast<int64_t>(main_shape_.num_blocks) * main_shape_.block_size * config_.kv_size() *
                        main_element_bytes();
  return static_cast<std::byte*>(main_.data()) + index * bytes;
}

__nv_bfloat16* DeviceKvPools::k_pool(int layer) const {
  return fp8() ? nullptr : reinterpret_cast<__nv_bfloat16*>(main_array(2LL * layer));
}

__nv_bfloat16* DeviceKvPools::v_pool(int layer) const {
  return fp8() ? nullptr : reinterpret_cast<__nv_bfloat16*>(main_array(2LL * layer + 1));
}

uint8_t* DeviceKvPools::k_pool_fp8(int layer) const {
  return fp8() ? reinterpret_cast<uint8_t*>(main_array(2LL * layer)) : nullptr;
}

uint8_t* DeviceKvPools::v_pool_fp8(int layer) const {
  return fp8() ? reinterpret_cast<uint8_t*>(main_array(2LL * layer + 1)) : nullptr;
}

__nv_bfloat16* DeviceKvPools::residual_pool(int layer) const {
  if (residual_.data() == nullptr) return nullptr;
  const int64_t elements =
      static_cast<int64_t>(residual_shape_.num_blocks) * residual_shape_.block_size * 2 * residual_rank_stride_;
  return residual_.as<__nv_bfloat16>() + layer * elements;
}

void DeviceKvPools::allocate_host(KvPoolKind pool, int32_t num_blocks) {
  const bool is_main = pool == KvPoolKind::kMain;
  if ((is_main ? main_shape_.num_blocks : residual_shape_.num_blocks) <= 0)
    fail(ErrorKind::kInvalidArgument, "cuda backend: host {} pool before its device pool was allocated",
         is_main ? "KV" : "residual");
  std::unique_ptr<HostKvTier>& tier = host_tiers_[static_cast<int>(pool)];
  if (tier == nullptr) tier = std::make_unique<HostKvTier>(device_);
  // Arrays: per layer K then V (main), or per layer the rCache.
  tier->allocate(num_blocks, num_arrays(pool), device_bytes_per_block(pool));
}

std::span<std::byte> DeviceKvPools::host_block(KvPoolKind pool, int32_t host_block_id) {
  HostKvTier* tier = host_tiers_[static_cast<int>(pool)].get();
  if (tier == nullptr)
    fail(ErrorKind::kInvalidArgument, "cuda backend: no host {} pool allocated", pool == KvPoolKind::kMain ? "KV" : "residual");
  return tier->block_bytes(host_block_id);
}

int32_t DeviceKvPools::num_host_blocks(KvPoolKind pool) const {
  const std::unique_ptr<HostKvTier>& tier = host_tiers_[static_cast<int>(pool)];
  return tier != nullptr ? tier->num_blocks() : 0;
}

size_t DeviceKvPools::device_bytes_per_block(KvPoolKind pool) const {
  if (pool == KvPoolKind::kMain)
    return static_cast<size_t>(main_shape_.block_size) * config_.kv_size() * main_element_bytes();
  return static_cast<size_t>(residual_shape_.block_size) * 2 * residual_rank_stride_ * sizeof(__nv_bfloat16);
}

HostKvTier::DevicePool DeviceKvPools::device_pool(KvPoolKind pool) const {
  if (pool == KvPoolKind::kMain)
    return {main_array(0), main_shape_.num_blocks,
            static_cast<size_t>(main_shape_.num_blocks) * device_bytes_per_block(pool)};
  return {residual_pool(0), residual_shape_.num_blocks,
          static_cast<size_t>(residual_shape_.num_blocks) * device_bytes_per_block(pool)};
}

void DeviceKvPools::copy_blocks(KvPoolKind pool, KvCopyDirection direction, std::span<const int32_t> device_block_ids,
                                std::span<const int32_t> host_block_ids) {
  const char* name = pool == KvPoolKind::kMain ? "KV" : "residual";
  HostKvTier* tier = host_tiers_[static_cast<int>(pool)].get();
  if (tier == nullptr || tier->num_blocks() == 0)
    fail(ErrorKind::kInvalidArgument, "cuda backend: copy of {} blocks with no host {} pool allocated",
         device_block_ids.size(), name);
  // The device pool may have been reallocated with another block size (or rank) since.
  if (tier->bytes_per_block() != device_bytes_per_block(pool))
    fail(ErrorKind::kInvalidArgument,
         "cuda backend: host {} pool has blocks of {} bytes per array, the device pool {}; reallocate it", name,
         tier->bytes_per_block(), device_bytes_per_block(pool));
  // Reads the step's blocks without ordering against the compute stream: a
  // step synchronises before it returns, so what an offload reads has landed,
  // and a load's blocks are not read until it has finished (the KV cache
  // manager's states).
  tier->copy(direction, device_pool(pool), device_block_ids, host_block_ids);
}

}  // namespace loom::cuda
