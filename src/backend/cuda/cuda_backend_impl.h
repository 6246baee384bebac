// The CUDA backend class itself, for the backend's own tests and benchmarks
// (tests/cuda, bench/cuda), which time the device work without the host copy
// of the logits and run kernels on the backend's buffers. Everyone else uses
// the Backend interface through cuda_backend.h.
//
// The backend joins parts with one job each and owns them:
//   DeviceKvPools  the KV pools, the rCache and their host tiers
//   LoraLauncher   the bound adapters and each projection group's LoRA launches
//   DevicePlan     the step's plan (step_plan.h) and its upload
//   StepBuffers    the activations
//   LayerRunner    the model's pass (embedding, layers, logits) over those parts
//   DeviceSampler  the draws and their copy back
//   L2Prefetcher   weights read ahead into L2 in small captured steps
//   GraphCache     the captured decode steps
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_kv_pools.h"
#include "backend/cuda/device_model.h"
#include "backend/cuda/device_plan.h"
#include "backend/cuda/device_sampler.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/graph_cache.h"
#include "backend/cuda/l2_prefetcher.h"
#include "backend/cuda/layer_runner.h"
#include "backend/cuda/lora_launcher.h"
#include "backend/cuda/step_buffers.h"
#include "backend/cuda/vocab_gather.h"
#include "lora/adapter.h"

namespace loom::cuda {

class CudaBackend final : public Backend {
 public:
  // Takes ownership of `stream` (created by the factory on `device`).
  CudaBackend(const ModelConfig& config, DeviceModel model, cudaStream_t stream, int device,
              const CudaBackendConfig& backend_config);
  ~CudaBackend() override;

  void allocate_kv_cache(const KvCacheShape& shape) override;
  KvCacheShape kv_cache_shape() const override { return pools_.main_shape(); }
  int64_t kv_bytes_per_token() const override { return pools_.main_bytes_per_token(); }
  // The ForkKV rCache (plan_types.h's layout, bf16, max_rank <= kResidualMaxRank).
  void allocate_residual_cache(const ResidualCacheShape& shape) override;
  ResidualCacheShape residual_cache_shape() const override { return pools_.residual_shape(); }
  int64_t residual_bytes_per_token(int32_t max_rank) const override { return pools_.residual_bytes_per_token(max_rank); }
  void allocate_host_kv_cache(KvPoolKind pool, int32_t num_blocks) override;
  int32_t num_host_kv_blocks(KvPoolKind pool) const override { return pools_.num_host_blocks(pool); }
  std::span<std::byte> host_kv_block(KvPoolKind pool, int32_t host_block_id) override;
  void copy_kv_blocks(KvPoolKind pool, KvCopyDirection direction, std::span<const int32_t> device_block_ids,
                      std::span<const int32_t> host_block_ids) override;
  void set_adapter(int32_t slot, std::shared_ptr<const LoraAdapter> adapter) override;
  int32_t max_adapter_slots() const override { return lora_.num_slots(); }
  // Decode steps (no prefill tiles, at most max_graph_rows rows, no hidden-state
  // capture) run as CUDA graphs when CudaTuning::cuda_graphs: the step's plan is
  // padded (StepPlan::pad_for_graph), the first step of each launch shape runs
  // eagerly and is captured, later ones replay the graph after uploading their
  // plan. Other steps run eagerly.
  ForwardResult forward(const Batch& batch) override;
  void enqueue_forward(const Batch& batch) override;
  ForwardResult finish_forward(std::span<const uint32_t> token_masks) override;
  // Every sharing mode (forked: k/v ranks up to kResidualMaxRank), the head
  // dims the attention kernels are built for, LoRA ranks up to kLoraMaxRank,
  // device sampling, host tiers, hidden-state capture.
  BackendCapabilities capabilities() const override { return cuda_backend_capabilities(); }
  // "cuda_graphs" (GraphCache::kCapacity) and "cublas_algos" (Gemm's heuristic choices by shape).
  std::vector<CacheGauge> cache_gauges() const override;
  // The pools' device arrays (backend.h KvPoolMemory, kind kCuda). A step whose
  // Batch::kv_layer_listener is set runs eagerly, with plain launches, and tells
  // the listener after each layer's K/V writes with an event recorded after them
  // (reused by later steps). Not yet declared in capabilities(): its GPU test
  // (CudaKvLayerListener.*) has not run.
  KvPoolMemory kv_pool_memory(KvPoolKind pool) override;

  // For tests and benchmarks. One whole step enqueued eagerly with no host
  // synchronisation (so it can be captured in a CUDA graph once the buffers
  // have grown to the batch's size: run it once uncaptured first), its draw
  // included; the logits stay on the device. `token_masks` as finish_forward's.
  void enqueue_step(const Batch& batch, std::span<const uint32_t> token_masks = {});
  GraphCache::Stats graph_stats() const { return graphs_.stats(); }
  int32_t num_graphs() const { return static_cast<int32_t>(graphs_.size()); }
  const CudaTuning& tuning() const { return tuning_; }
  cudaStream_t stream() const { return stream_; }
  const DeviceModel& model() const { return model_; }
  const ModelConfig& config() const { return config_; }
  const StepPlan& plan() const { return plan_.plan(); }
  // Device logits of the last enqueued step: [rows, vocab] fp32.
  const float* device_logits() const { return buffers_.logits.as<float>(); }
  // The bound adapters' modules on the device, [slot][layer][kNumLoraTargets].
  const LoraModuleRef* device_lora_modules() const { return lora_.device_table(); }
  // Device sampling results of the last enqueued step (Batch::sampling):
  // [rows] token ids (-1: not sampled on the device), then [rows] logprobs.
  const int32_t* device_sampled_tokens() const { return sampler_.device_results(); }
  const DeviceKvPools& kv_pools() const { return pools_; }
  int device() const { return device_; }
  // This layer's K / V pool, or rCache (nullptr before its allocate).
  __nv_bfloat16* k_pool(int layer) const { return pools_.k_pool(layer); }
  __nv_bfloat16* v_pool(int layer) const { return pools_.v_pool(layer); }
  __nv_bfloat16* residual_pool(int layer) const { return pools_.residual_pool(layer); }

#ifdef LOOM_CUDA_MEASURE
  // The benchmark's build only (measure_switches.h): switches that change how
  // later steps run (each drops the captured graphs).
  void set_tuning(const CudaTuning& tuning);
  CudaMeasureSwitches& measure() {
    graphs_.clear();
    return lora_.measure();
  }
#endif

 private:
  // Validates and plans the step (padded for a graph when for_graph and it qualifies).
  void plan_step(const Batch& batch, bool for_graph);
  // Grows the buffers to the plan and uploads it.
  void prepare_step();
  // The model's pass, then the draw unless it is guided (finish_forward draws those).
  void enqueue_kernels(bool with_sampling);
  void enqueue_guided_draw(std::span<const uint32_t> token_masks);
  // What the draw reads: the step's logits, made whole first on a tensor-parallel rank.
  float* whole_logits();
  std::vector<const void*> graph_addresses() const;
  // Makes device_ current on the calling thread (every entry point the engine calls first).
  void use_device() const;

  const ModelConfig config_;
  const LayerSpec layer_;  // layer_spec(config_)
  const int device_;
  const CudaRank rank_;  // model_vocab_size filled in
  CudaTuning tuning_;  // changed only by the benchmark's set_tuning
  const bool wide_prefill_;  // tuning_.wgmma_prefill where the head dim has the kernel
  int32_t num_sms_ = 132;
  int32_t decode_ctas_per_sm_ = 0;  // attention_decode_ctas_per_sm(head_dim)
  std::array<int32_t, kResidualMaxRank + 1> forked_decode_ctas_per_sm_{};  // by rank, 0: not asked yet
  cudaStream_t stream_ = nullptr;
  DeviceModel model_;
  Gemm gemm_;
  DeviceKvPools pools_;
  LoraLauncher lora_;
  DevicePlan plan_;
  StepBuffers buffers_;
  L2Prefetcher prefetcher_;
  LayerRunner runner_;
  VocabGather vocab_gather_;  // a tensor-parallel rank's logits made whole before the draw
  DeviceSampler sampler_;     // over vocab_gather_.vocab_size()
  GraphCache graphs_;
  PinnedBuffer logits_host_;
  std::vector<cudaEvent_t> layer_events_;  // [num_layers], created by the first step with a KV listener

  // The step between enqueue_forward and finish_forward.
  const Batch* batch_ = nullptr;
  StepLaunch step_;
  bool guided_ = false;  // its draw needs the host's masks or edits (DeviceSampler::guided)
};

// make_synthetic_cuda_backend as a CudaBackend (tests and benchmarks). With a
// tensor-parallel rank (backend_config.rank.shard.size > 1), `config` is the
// whole model's: the rank draws its slices only and runs rank_config().
std::unique_ptr<CudaBackend> make_synthetic_cuda_backend_impl(const ModelConfig& config, uint64_t seed,
                                                              bool round_to_bf16,
                                                              const CudaBackendConfig& backend_config = {});

}  // namespace loom::cuda
