#include "backend/cpu/cpu_kv_pools.h"

#include <new>

#include "util/error.h"

namespace loom::cpu {

void CpuKvPools::allocate_main(const KvCacheShape& shape) {
  if (shape.num_blocks <= 0 || shape.block_size <= 0)
    fail(ErrorKind::kInvalidArgument, "cpu backend: KV cache of {} blocks of {} tokens", shape.num_blocks,
         shape.block_size);
  const int64_t floats_per_pool = static_cast<int64_t>(shape.num_blocks) * shape.block_size * kv_size_;
  k_.clear();
  v_.clear();
  main_shape_ = {0, 0};
  try {
    k_.resize(num_layers_);
    v_.resize(num_layers_);
    for (int layer = 0; layer < num_layers_; ++layer) {
      k_[layer].assign(floats_per_pool, 0.0f);
      v_[layer].assign(floats_per_pool, 0.0f);
    }
  } catch (const std::bad_alloc&) {
    k_.clear();
    v_.clear();
    fail(ErrorKind::kCapacity, "cpu backend: cannot allocate a KV cache of {} bytes",
         floats_per_pool * 2 * num_layers_ * static_cast<int64_t>(sizeof(float)));
  }
  main_shape_ = shape;
}

void CpuKvPools::allocate_residual(const ResidualCacheShape& shape) {
  if (shape.num_blocks <= 0 || shape.block_size <= 0 || shape.max_rank <= 0)
    fail(ErrorKind::kInvalidArgument, "cpu backend: residual cache of {} blocks of {} tokens, max rank {}",
         shape.num_blocks, shape.block_size, shape.max_rank);
  const int64_t floats_per_pool = static_cast<int64_t>(shape.num_blocks) * shape.block_size * 2 * shape.max_rank;
  residual_.clear();
  residual_shape_ = {0, 0, 0};
  try {
    residual_.resize(num_layers_);
    for (auto& pool : residual_) pool.assign(floats_per_pool, 0.0f);
  } catch (const std::bad_alloc&) {
    residual_.clear();
    fail(ErrorKind::kCapacity, "cpu backend: cannot allocate a residual cache of {} bytes",
         floats_per_pool * num_layers_ * static_cast<int64_t>(sizeof(float)));
  }
  residual_shape_ = shape;
}

std::vector<float*> CpuKvPools::device_arrays(KvPoolKind pool) {
  std::vector<float*> arrays;
  for (int layer = 0; layer < num_layers_; ++layer) {
    if (pool == KvPoolKind::kMain) {
      if (layer < static_cast<int>(k_.size())) {
        arrays.push_back(k_[layer].data());
        arrays.push_back(v_[layer].data());
      }
    } else if (layer < static_cast<int>(residual_.size())) {
      arrays.push_back(residual_[layer].data());
    }
  }
  return arrays;
}

int64_t CpuKvPools::device_floats_per_block(KvPoolKind pool) const {
  if (pool == KvPoolKind::kMain) return static_cast<int64_t>(main_shape_.block_size) * kv_size_;
  return static_cast<int64_t>(residual_shape_.block_size) * 2 * residual_shape_.max_rank;
}

KvPoolMemory CpuKvPools::memory(KvPoolKind pool) {
  KvPoolMemory memory;
  memory.arrays_per_layer = pool == KvPoolKind::kMain ? 2 : 1;
  memory.num_blocks = num_device_blocks(pool);
  memory.bytes_per_block = device_floats_per_block(pool) * static_cast<int64_t>(sizeof(float));
  for (float* array : device_arrays(pool)) memory.arrays.push_back(reinterpret_cast<std::byte*>(array));
  return memory;
}

void CpuKvPools::allocate_host(KvPoolKind pool, int32_t num_blocks) {
  const bool is_main = pool == KvPoolKind::kMain;
  HostKvPool& host = is_main ? host_main_ : host_residual_;
  host.allocate(num_blocks, num_device_blocks(pool), is_main ? 2 * num_layers_ : num_layers_,
                device_floats_per_block(pool), is_main ? "host KV pool" : "host residual pool");
}

void CpuKvPools::copy_blocks(KvPoolKind pool, KvCopyDirection direction, std::span<const int32_t> device_block_ids,
                             std::span<const int32_t> host_block_ids) {
  const HostKvPool& pool_on_host = host(pool);
  pool_on_host.check_copyable(device_floats_per_block(pool), device_block_ids.size());
  // A local list, not backend scratch: this runs beside forward().
  pool_on_host.copy(direction, device_arrays(pool), num_device_blocks(pool), device_block_ids, host_block_ids);
}

}  // namespace loom::cpu
