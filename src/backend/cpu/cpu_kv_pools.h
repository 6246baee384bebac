// The CPU backend's KV memory: the main K/V pools, ForkKV's rCache and the
// host tier of each (host_kv_pool.h). Owns all of it; an address it hands out
// is valid until the next allocate of that pool.
//
// Layouts: main pool per layer K and V, [num_blocks * block_size][kv_size] fp32
// each; rCache per layer [num_blocks * block_size][2 * max_rank] fp32.
//
// Threads: the engine thread, except copy_blocks and host_block (any thread,
// backend.h "Host tier").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/host_kv_pool.h"
#include "model/config.h"

namespace loom::cpu {

class CpuKvPools {
 public:
  explicit CpuKvPools(const ModelConfig& config) : num_layers_(config.num_layers), kv_size_(config.kv_size()) {}

  // (Re)allocate a pool, zeroed; previous contents are lost. Error(kInvalidArgument)
  // for an empty shape, Error(kCapacity) when the memory cannot be had.
  void allocate_main(const KvCacheShape& shape);
  void allocate_residual(const ResidualCacheShape& shape);
  KvCacheShape main_shape() const { return main_shape_; }
  ResidualCacheShape residual_shape() const { return residual_shape_; }
  float* k_pool(int layer) { return k_[layer].data(); }
  float* v_pool(int layer) { return v_[layer].data(); }
  float* residual_pool(int layer) { return residual_[layer].data(); }

  // The device-side arrays of `pool` (main: per layer K then V; residual: per
  // layer the rCache), num_device_blocks x device_floats_per_block floats each.
  std::vector<float*> device_arrays(KvPoolKind pool);
  int32_t num_device_blocks(KvPoolKind pool) const {
    return pool == KvPoolKind::kMain ? main_shape_.num_blocks : residual_shape_.num_blocks;
  }
  // Floats one block of one array holds (0 before the pool is allocated).
  int64_t device_floats_per_block(KvPoolKind pool) const;
  // device_arrays as backend.h's KvPoolMemory (host memory; empty before the pool is allocated).
  KvPoolMemory memory(KvPoolKind pool);

  // Host tiers (backend.h "Host tier"): a pool's host tier needs its device pool first.
  void allocate_host(KvPoolKind pool, int32_t num_blocks);
  int32_t num_host_blocks(KvPoolKind pool) const { return host(pool).num_blocks(); }
  std::span<std::byte> host_block(KvPoolKind pool, int32_t host_block_id) const {
    return host(pool).block_bytes(host_block_id);
  }
  void copy_blocks(KvPoolKind pool, KvCopyDirection direction, std::span<const int32_t> device_block_ids,
                   std::span<const int32_t> host_block_ids);

 private:
  const HostKvPool& host(KvPoolKind pool) const { return pool == KvPoolKind::kMain ? host_main_ : host_residual_; }

  const int32_t num_layers_;
  const int64_t kv_size_;
  KvCacheShape main_shape_{0, 0};
  std::vector<std::vector<float>> k_, v_;  // [layer]
  ResidualCacheShape residual_shape_{0, 0, 0};
  std::vector<std::vector<float>> residual_;  // [layer]
  HostKvPool host_main_;      // arrays: per layer K, V
  HostKvPool host_residual_;  // arrays: per layer rCache
};

}  // namespace loom::cpu
