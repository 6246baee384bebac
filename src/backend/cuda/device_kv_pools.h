// The CUDA backend's KV memory: the main K/V pool, ForkKV's rCache with the
// scratch the forked wide prefill rebuilds keys into, and the host tier of each
// pool (host_kv_tier.h). Owns all of it; an address it hands out is valid until
// the next allocate of that pool.
//
// Layouts: main pool [layer][K|V][num_blocks * block_size][kv_size] bf16, or
// e4m3 bytes for an FP8 cache (--kv-cache-dtype fp8, kv_fp8.cuh; slots
// head-major within a block, plan_types.h); rCache [layer][num_blocks *
// block_size][2 * residual_rank_stride] bf16 (also with an FP8 main pool: it
// is rank-sized, a few per cent of the main pool); scratch [K|V][keys][kv_size] bf16.
//
// Thread: the engine thread, except copy_blocks (host_kv_tier.h's rules).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/host_kv_tier.h"
#include "model/config.h"

namespace loom::cuda {

class DeviceKvPools {
 public:
  // forked_wide_prefill_keys: the scratch's KV entries, taken with the rCache (CudaTuning).
  // kv_dtype: the main pool's element type (kFp8E4M3: one byte an entry).
  DeviceKvPools(const ModelConfig& config, int device, int32_t forked_wide_prefill_keys,
                KvCacheDtype kv_dtype = KvCacheDtype::kAuto);

  // (Re)allocate a pool, zeroed (a slot read before it is written gives no NaN),
  // on `stream`, synchronously; previous contents are lost. Error(kCapacity)
  // when the memory cannot be had, Error(kUnsupported) for an rCache rank above
  // kResidualMaxRank, Error(kInvalidArgument) for an empty shape.
  void allocate_main(const KvCacheShape& shape, cudaStream_t stream);
  void allocate_residual(const ResidualCacheShape& shape, cudaStream_t stream);
  KvCacheShape main_shape() const { return main_shape_; }
  ResidualCacheShape residual_shape() const { return residual_shape_; }
  int32_t residual_rank_stride() const { return residual_rank_stride_; }
  int64_t main_bytes_per_token() const;
  int64_t residual_bytes_per_token(int32_t max_rank) const;

  bool fp8() const { return kv_dtype_ == KvCacheDtype::kFp8E4M3; }
  // This layer's K / V pool or rCache (nullptr before its allocate); k_pool and
  // v_pool are nullptr for an FP8 main pool, k_pool_fp8 and v_pool_fp8 for a bf16 one.
  __nv_bfloat16* k_pool(int layer) const;
  __nv_bfloat16* v_pool(int layer) const;
  uint8_t* k_pool_fp8(int layer) const;
  uint8_t* v_pool_fp8(int layer) const;
  // An FP8 cache's scales per layer (a checkpoint's: DeviceModel::k_cache_scales);
  // empty: 1.0 everywhere, vLLM's default without checkpoint or calibrated scales.
  void set_fp8_scales(std::vector<float> k_scales, std::vector<float> v_scales);
  float k_scale(int layer) const { return k_scales_.empty() ? 1.0f : k_scales_[layer]; }
  float v_scale(int layer) const { return v_scales_.empty() ? 1.0f : v_scales_[layer]; }
  // The main pool's first byte (graph capture keys), nullptr before its allocate.
  const void* main_base() const { return main_.data(); }
  // Each pool's one allocation (every layer's arrays lie in it), nullptr before its allocate.
  void* main_allocation() const { return main_.data(); }
  void* residual_allocation() const { return residual_.data(); }
  __nv_bfloat16* residual_pool(int layer) const;
  // The scratch's K half (V follows after scratch_keys() entries), and its size in entries.
  __nv_bfloat16* scratch_k() const { return scratch_.as<__nv_bfloat16>(); }
  int64_t scratch_keys() const;

  // Host tiers (backend.h "Host tier"): allocate_host needs the device pool first.
  void allocate_host(KvPoolKind pool, int32_t num_blocks);
  int32_t num_host_blocks(KvPoolKind pool) const;
  std::span<std::byte> host_block(KvPoolKind pool, int32_t host_block_id);
  void copy_blocks(KvPoolKind pool, KvCopyDirection direction, std::span<const int32_t> device_block_ids,
                   std::span<const int32_t> host_block_ids);
  // What a host tier copies (another's: the tensor-parallel group's): the
  // pool's arrays (main: per layer K then V; residual: per layer the rCache),
  // one array's block in bytes, and where they are.
  int32_t num_arrays(KvPoolKind pool) const { return pool == KvPoolKind::kMain ? 2 * config_.num_layers : config_.num_layers; }
  size_t device_bytes_per_block(KvPoolKind pool) const;
  HostKvTier::DevicePool device_pool(KvPoolKind pool) const;

 private:
  // The main pool's layer array `index` (2 layer + 0 for K, + 1 for V), nullptr before allocate.
  std::byte* main_array(int64_t index) const;
  int64_t main_element_bytes() const { return fp8() ? 1 : static_cast<int64_t>(sizeof(__nv_bfloat16)); }

  const ModelConfig config_;
  const int device_;
  const KvCacheDtype kv_dtype_;
  const int32_t forked_wide_prefill_keys_;
  KvCacheShape main_shape_{0, 0};
  DeviceBuffer main_;
  ResidualCacheShape residual_shape_{0, 0, 0};
  int32_t residual_rank_stride_ = 0;  // residual_rank_stride(residual_shape_.max_rank)
  DeviceBuffer residual_;
  DeviceBuffer scratch_;
  std::unique_ptr<HostKvTier> host_tiers_[2];  // [KvPoolKind], created by allocate_host
  std::vector<float> k_scales_, v_scales_;      // [num_layers] or empty
};

}  // namespace loom::cuda
