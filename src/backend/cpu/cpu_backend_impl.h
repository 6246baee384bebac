// The CPU backend's class (cpu_backend.h says what it does), declared here for
// the tensor-parallel backend that runs several of them as ranks
// (tensor_parallel_cpu_backend.h). Internal to backend/cpu.
//
// As a rank: it runs the model shard rank_config(model, shard) with the shard's
// weights and adapters, joins its group's all-reduces after o_proj, down_proj
// and the embedding, checks batches against the whole model's vocabulary, and
// returns its slice of the logits (ForwardResult::vocab_size is the slice's).
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_kv_pools.h"
#include "backend/cpu/cpu_step_buffers.h"
#include "backend/cpu/lora_apply.h"
#include "backend/cpu/paged_attention.h"
#include "backend/rope.h"
#include "lora/adapter.h"
#include "model/config.h"
#include "model/layer_spec.h"
#include "model/tensor_parallel.h"
#include "model/weights.h"

namespace loom::cpu {

class InProcessGroup;

// A rank's place in its group; the default is a backend alone.
struct CpuRank {
  TensorParallelShard shard;        // rank 0 of 1: the whole model
  InProcessGroup* group = nullptr;  // not owned; outlives the backend; nullptr alone
  int32_t model_vocab_size = 0;     // the whole model's (token ids are checked against it)
};

class CpuBackend final : public Backend {
 public:
  // `config` and `weights` are what this backend runs: the model, or a rank's
  // shard of it (rank_config / shard_model_weights).
  CpuBackend(const ModelConfig& config, std::shared_ptr<const ModelWeights> weights,
             const CpuBackendConfig& backend_config, const CpuRank& rank = {});

  void allocate_kv_cache(const KvCacheShape& shape) override;
  KvCacheShape kv_cache_shape() const override { return pools_.main_shape(); }
  int64_t kv_bytes_per_token() const override {
    return static_cast<int64_t>(config_.num_layers) * 2 * layer_.kv_size() * sizeof(float);
  }
  void allocate_residual_cache(const ResidualCacheShape& shape) override;
  ResidualCacheShape residual_cache_shape() const override { return pools_.residual_shape(); }
  int64_t residual_bytes_per_token(int32_t max_rank) const override {
    return static_cast<int64_t>(config_.num_layers) * 2 * max_rank * sizeof(float);
  }
  void allocate_host_kv_cache(KvPoolKind pool, int32_t num_blocks) override { pools_.allocate_host(pool, num_blocks); }
  int32_t num_host_kv_blocks(KvPoolKind pool) const override { return pools_.num_host_blocks(pool); }
  std::span<std::byte> host_kv_block(KvPoolKind pool, int32_t host_block_id) override {
    return pools_.host_block(pool, host_block_id);
  }
  void copy_kv_blocks(KvPoolKind pool, KvCopyDirection direction, std::span<const int32_t> device_block_ids,
                      std::span<const int32_t> host_block_ids) override {
    pools_.copy_blocks(pool, direction, device_block_ids, host_block_ids);
  }
  void set_adapter(int32_t slot, std::shared_ptr<const LoraAdapter> adapter) override;
  int32_t max_adapter_slots() const override { return static_cast<int32_t>(adapters_.size()); }
  ForwardResult forward(const Batch& batch) override;
  // The reference: every sharing mode, head dim (even: RoPE pairs) and rank;
  // sampling stays on the host; no FP8 weights or KV (FP8 checkpoints dequantized).
  BackendCapabilities capabilities() const override {
    BackendCapabilities capabilities;
    capabilities.name = "cpu";
    capabilities.kv_sharing_modes = all_kv_sharing_modes();
    capabilities.host_kv_tier = true;
    capabilities.residual_host_kv_tier = true;
    capabilities.capture_hidden_states = true;
    capabilities.dequantizes_fp8_weights = true;  // FP8 checkpoints: fp32 emulation (cpu_backend.h)
    capabilities.kv_layer_notifications = true;
    return capabilities;
  }
  KvPoolMemory kv_pool_memory(KvPoolKind pool) override { return pools_.memory(pool); }

  // The KV pools (what the tensor-parallel group's host tier copies).
  CpuKvPools& kv_pools() { return pools_; }

 private:
  // The group's all-reduce of `count` floats (nothing alone).
  void all_reduce(float* data, int64_t count);
  void group_rows_by_adapter(const Batch& batch);
  void prepare_rope_tables(const Batch& batch);
  void extend_position_tables(int32_t num_positions);
  void embed_rows(const Batch& batch);
  void choose_logit_rows(const Batch& batch);
  void capture_hidden_states(int index, ForwardResult& result) const;
  void attention_block(int layer, const Batch& batch);
  void mlp_block(int layer);
  void apply_lora(LoraTarget target, int layer, const float* x, int64_t in_features, float* y,
                  int64_t out_features);
  void compute_logits(ForwardResult& result);

  const ModelConfig config_;  // what this backend runs (a rank: its shard's config)
  const CpuRank rank_;
  const LayerSpec layer_;  // layer_spec(config_): what attention_block and mlp_block run
  const std::shared_ptr<const ModelWeights> weights_;
  const int num_threads_;
  const Rope rope_;

  CpuKvPools pools_;
  std::vector<std::shared_ptr<const LoraAdapter>> adapters_;  // [slot], nullptr = free
  bool warned_about_sliding_window_ = false;
  // cos/sin of positions 0 .. num_table_positions_ - 1 (deferred RoPE of forked
  // sequences), [position, head_dim / 2]; grown on demand, never changes.
  std::vector<float> position_cos_, position_sin_;
  int32_t num_table_positions_ = 0;

  cpu::LoraApplier lora_;     // q, o, gate, up, down over all rows (and k, v without sharing)
  cpu::LoraApplier kv_lora_;  // k, v when the batch shares KV: tokens only, forked ones excluded
  bool kv_lora_is_row_lora_ = true;
  CpuStepBuffers step_;  // per-forward scratch
};

}  // namespace loom::cpu
