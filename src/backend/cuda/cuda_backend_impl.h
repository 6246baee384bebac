// The CUDA backend class itself, for the backend's own tests and benchmarks
// (tests/cuda, bench/cuda), which time the device work without the host copy
// of the logits and run kernels on the backend's buffers. Everyone else uses
// the Backend interface through cuda_backend.h.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_lora.h"
#include "backend/cuda/device_model.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/host_kv_tier.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/step_plan.h"
#include "lora/adapter.h"

namespace loom::cuda {

class CudaBackend : public Backend {
 public:
  // Takes ownership of `stream` (created by the factory on `device`).
  CudaBackend(const ModelConfig& config, DeviceModel model, cudaStream_t stream, int device,
              const CudaBackendConfig& backend_config);
  ~CudaBackend() override;

  void allocate_kv_cache(const KvCacheShape& shape) override;
  KvCacheShape kv_cache_shape() const override { return kv_shape_; }
  int64_t kv_bytes_per_token() const override;
  // The ForkKV rCache (plan_types.h's layout, bf16, max_rank <= kResidualMaxRank).
  void allocate_residual_cache(const ResidualCacheShape& shape) override;
  ResidualCacheShape residual_cache_shape() const override { return residual_shape_; }
  int64_t residual_bytes_per_token(int32_t max_rank) const override;
  // Host tier (host_kv_tier.h, host_kv_tier.cc) of the main pool and of the rCache.
  void allocate_host_kv_cache(KvPoolKind pool, int32_t num_blocks) override;
  int32_t num_host_kv_blocks(KvPoolKind pool) const override;
  std::span<std::byte> host_kv_block(KvPoolKind pool, int32_t host_block_id) override;
  void copy_kv_blocks(KvPoolKind pool, KvCopyDirection direction, std::span<const int32_t> device_block_ids,
                      std::span<const int32_t> host_block_ids) override;
  void set_adapter(int32_t slot, std::shared_ptr<const LoraAdapter> adapter) override;
  int32_t max_adapter_slots() const override { return static_cast<int32_t>(adapters_.size()); }
  ForwardResult forward(const Batch& batch) override;
  // Every sharing mode (forked: k/v ranks up to kResidualMaxRank), the head
  // dims the attention kernels are built for, LoRA ranks up to kLoraMaxRank,
  // device sampling, host tiers, hidden-state capture.
  BackendCapabilities capabilities() const override { return cuda_backend_capabilities(); }
  // "cuda_graphs" (captured decode graphs, kMaxGraphs) and "cublas_algos" (Gemm's heuristic choices by shape).
  std::vector<CacheGauge> cache_gauges() const override;

  // forward() runs decode steps (no prefill tiles, at most max_graph_rows rows,
  // no hidden-state capture) as CUDA graphs when CudaBackendConfig::cuda_graphs:
  // the step's plan is padded (StepPlan::pad_for_graph), the first step of each
  // LaunchCounts runs eagerly and is captured, later ones replay the graph
  // after uploading their plan. Other steps run eagerly.
  struct GraphStats {
    int64_t captures = 0, replays = 0, eager_steps = 0, evictions = 0;
  };
  GraphStats graph_stats() const { return graph_stats_; }
  int32_t num_graphs() const { return static_cast<int32_t>(graphs_.size()); }
  void set_cuda_graphs(bool enabled) { graphs_enabled_ = enabled; }

  // forward() in two halves, always eager: validate, plan and enqueue the whole
  // step (no host synchronisation, so it can be captured in a CUDA graph once
  // the buffers have grown to the batch's size: call it once uncaptured first) ...
  void enqueue_forward(const Batch& batch);
  // ... then wait and copy the logits of the enqueued step to the host.
  ForwardResult finish_forward();

  cudaStream_t stream() const { return stream_; }
  const DeviceModel& model() const { return model_; }
  const ModelConfig& config() const { return config_; }
  const StepPlan& plan() const { return plan_; }
  // Device logits of the last enqueued step: [rows, vocab] fp32.
  const float* device_logits() const { return logits_.as<float>(); }
  // The bound adapters' modules on the device, [slot][layer][kNumLoraTargets].
  const LoraModuleRef* device_lora_modules() const { return lora_table_->device_table(); }
  // Device sampling results of the last enqueued step (Batch::sampling):
  // [rows] token ids (-1: not sampled on the device), then [rows] logprobs.
  const int32_t* device_sampled_tokens() const { return sampled_.as<int32_t>(); }
  // Which kernels run the dense GEMMs of small (decode) steps:
  //   kAuto    skinny_gemm.cu for steps of up to skinny_max_rows rows (SwiGLU
  //            folded into gate/up when no LoRA applies), cuBLAS otherwise (default)
  //   kCublas  cuBLAS always
  // Measured on the H100 (8B shape, decode at 2K context, CUDA graph): 1 row
  // 6.32 ms vs cuBLAS 6.62 ms; 2 rows a wash with 4 loads a lane, 6.434 vs
  // 6.576 with 8; from 3 rows on cuBLAS wins. A tensor-core variant (weights
  // as the MMA's M side, no shared memory) ran 7.9 ms at 1-16 rows and was dropped.
  enum class DecodeGemm { kAuto, kCublas };
  void set_decode_gemm(DecodeGemm path) { decode_gemm_ = path; clear_graphs(); }
  // kAuto's skinny kernels serve steps of up to this many rows (1..kSkinnyGemmMaxRows;
  // default 2: H100, graph step, 2 rows 6.576 -> 6.434 ms, 3 rows 6.672 -> 6.887,
  // 4 rows 6.744 -> 8.334).
  void set_skinny_max_rows(int32_t rows) { skinny_max_rows_ = rows; clear_graphs(); }
  int32_t skinny_max_rows() const { return skinny_max_rows_; }
  // CudaBackendConfig::programmatic_max_rows.
  void set_programmatic_max_rows(int32_t rows) { programmatic_max_rows_ = rows; clear_graphs(); }
  // CudaBackendConfig::pingpong_prefill.
  void set_pingpong_prefill(bool enabled) { pingpong_prefill_ = enabled; clear_graphs(); }
  // Where the batched LoRA kernels run:
  //   kSideStream     on a second stream beside the base GEMM (default)
  //   kSideStreamPdl  the same, the expand a programmatic dependent launch of the shrink
  //   kInline         after the base GEMM on the main stream
  enum class LoraOverlap { kSideStream, kSideStreamPdl, kInline };
  void set_lora_overlap(LoraOverlap mode) { lora_overlap_ = mode; clear_graphs(); }
  // Which LoRA kernels run each projection group (lora.cu):
  //   kSplit  a shrink launch (split over the input features), then an expand launch (default)
  //   kFused  one launch: each CTA computes its tile's shrink, then expands a block of outputs
  //   kFusedAttention  fused for q/k/v and o, split for gate/up and down
  enum class LoraKernel { kFused, kSplit, kFusedAttention };
  void set_lora_kernel(LoraKernel kernel) { lora_kernel_ = kernel; clear_graphs(); }
  // With kSideStream: bit g set = projection group g (0 q/k/v, 1 o, 2 gate/up,
  // 3 down) on the side stream, clear = inline after its GEMM (for measuring).
  void set_lora_side_groups(uint32_t mask) { lora_side_groups_ = mask; clear_graphs(); }
  // gate/up's LoRA delta as bf16 (default) or fp32.
  void set_lora_bf16_gate_up(bool bf16) { lora_bf16_gate_up_ = bf16; clear_graphs(); }
  // Output columns per thread of the split path's expand kernel (1, 2 or 4).
  void set_lora_expand_columns(int32_t columns) { lora_expand_columns_ = columns; clear_graphs(); }
  // Captured (decode) steps of up to max_rows rows read weights ahead into L2 on
  // prefetch_stream_ while the latency-bound kernels run: after q/k/v's GEMM,
  // o_proj's weight and the first gate_up bytes (half gate rows, half up rows);
  // after down's GEMM, the next q/k/v weight's first bytes (the lm_head's after
  // the last layer). Each figure caps the bytes at its point; 0 turns it off.
  // Default (CudaBackendConfig::l2_prefetch): 16 / 8 / 8 MiB at up to 2 rows
  // (the skinny GEMMs'). H100, 8B shape, 2K context, graph step: 1 row 6.007 ->
  // 5.837 ms, 2 rows 6.373 -> 6.274; at 4, 16 and 64 rows (cuBLAS) it cost
  // 0.5-2% and stays off.
  struct L2Prefetch {
    int64_t o_proj = 0, gate_up = 0, qkv = 0;
    int32_t max_rows = 2;
  };
  void set_l2_prefetch(L2Prefetch prefetch) { l2_prefetch_ = prefetch; clear_graphs(); }
  L2Prefetch l2_prefetch() const { return l2_prefetch_; }
  // This layer's K / V pool (nullptr before allocate_kv_cache).
  __nv_bfloat16* k_pool(int layer) const;
  __nv_bfloat16* v_pool(int layer) const;
  // This layer's rCache (nullptr before allocate_residual_cache).
  __nv_bfloat16* residual_pool(int layer) const;

 protected:
  // Enqueues projection group `group`'s LoRA kernels (0 q/k/v, 1 o, 2 gate/up,
  // 3 down) on `stream`: launch_lora. The only override is the benchmark's
  // (bench/cuda), which leaves launches out to time them; serving never does.
  virtual void launch_lora_group(int group, const LoraParams& params, Launch launch) {
    launch_lora(params, launch);
  }

 private:
  // forward()'s parts: validate and plan (padded for a graph when for_graph and
  // the step qualifies); grow the buffers and upload the plan; enqueue every kernel.
  void plan_step(const Batch& batch, bool for_graph);
  void upload_plan();
  // with_sampling false: everything up to the logits (the masked path draws after its masks).
  void enqueue_kernels(bool with_sampling = true);
  // True when the step's draw needs the host's help after the model's work:
  // token masks (Batch::fill_token_masks) or logit processing (Batch::logit_edits, min_p).
  bool guided_sampling(const Batch& batch) const;
  // Takes the caller's masks once the model's work is enqueued, uploads them and
  // the logit edits, masks and processes the logits, draws, and puts the raw
  // logprobs back where processing changed them.
  void enqueue_guided_sampling(const Batch& batch);
  // Replays (or runs eagerly and captures) the padded plan's graph.
  void run_graph(bool with_sampling);
  void clear_graphs();
  std::vector<const void*> graph_buffers() const;  // every address a captured step holds
  void grow_buffers();
  // Where this step's own kernels launch: stream_, programmatically when step_programmatic_.
  Launch chain() const { return Launch(stream_, step_programmatic_); }
  // y = x W^T through the kernel decode_gemm_ picks for m rows.
  void linear(const __nv_bfloat16* x, int32_t m, int32_t k, const __nv_bfloat16* w, int32_t n, void* y, bool y_is_bf16,
              int32_t y_stride);
  // Enqueues one layer; returns its down_proj LoRA delta (nullptr: none), which
  // the next norm adds with delta_.
  const float* run_layer(int layer, const float* previous_lora_delta);
  // Batched LoRA of one projection group runs on lora_stream_ beside the base
  // GEMM (same input x, own output lora_out_ [LoRA rows, width] fp32, bf16 for
  // gate/up by default, which the
  // next kernel adds). begin_lora forks and enqueues it (kLoraNone: no LoRA rows);
  // end_lora(its answer) makes stream_ wait for a side-stream launch and returns lora_out_.
  static constexpr int kLoraNone = 0, kLoraInline = 1, kLoraSide = 2;  // begin_lora's answer
  // Makes device_ current on the calling thread (every entry point the engine calls first).
  void use_device() const;
  int begin_lora(int layer, std::initializer_list<LoraTarget> targets, const __nv_bfloat16* x, int32_t x_stride,
                 int32_t width);
  const float* end_lora(int active);
  template <typename T>
  T* plan_pointer(size_t section) const {
    return reinterpret_cast<T*>(plan_device_.as<int32_t>() + section);
  }

  const ModelConfig config_;
  const int device_;
  int32_t num_sms_ = 132;
  int32_t decode_ctas_per_sm_ = 0;  // attention_decode_ctas_per_sm(head_dim)
  DecodeGemm decode_gemm_ = DecodeGemm::kAuto;
  int32_t skinny_max_rows_ = 2;
  LoraOverlap lora_overlap_ = LoraOverlap::kSideStream;
  LoraKernel lora_kernel_ = LoraKernel::kSplit;
  uint32_t lora_side_groups_ = 0xF;
  int32_t lora_expand_columns_ = 1;
  bool lora_bf16_gate_up_ = true;
  cudaStream_t stream_ = nullptr;
  DeviceModel model_;
  std::unique_ptr<Gemm> gemm_;
  std::vector<std::shared_ptr<const LoraAdapter>> adapters_;
  std::unique_ptr<DeviceLoraTable> lora_table_;

  KvCacheShape kv_shape_{0, 0};
  DeviceBuffer kv_pool_;  // [layer][K|V][num_blocks * block_size][kv_size] bf16
  ResidualCacheShape residual_shape_{0, 0, 0};
  int32_t residual_rank_stride_ = 0;  // residual_rank_stride(residual_shape_.max_rank)
  DeviceBuffer residual_pool_;  // [layer][num_blocks * block_size][2 * residual_rank_stride_] bf16
  std::unique_ptr<HostKvTier> host_kv_tiers_[2];  // [KvPoolKind], created by allocate_host_kv_cache
  // Bytes of one block of one layer's K (or V) pool, or of its rCache.
  size_t device_bytes_per_block(KvPoolKind pool) const;
  HostKvTier::DevicePool device_pool(KvPoolKind pool) const;
  // Largest k/v LoRA rank of each slot's adapter (ResidualAttention's rank tier).
  std::vector<int32_t> kv_rank_of_slot_;
  int32_t residual_rank_ = 0;  // the enqueued step's: max over its forked sequences' adapters
  std::array<int32_t, kResidualMaxRank + 1> forked_decode_ctas_per_sm_{};  // by rank, 0: not asked yet

  // CUDA graphs of decode steps, by launch shape (run_graph); all dropped when a
  // buffer moves (graph_buffers_), a pool is reallocated or a switch above
  // changes; beyond kMaxGraphs the least recently replayed goes.
  struct GraphKey {
    LaunchCounts counts;
    int32_t residual_rank = 0, lora_max_rank = 0;
    bool with_sampling = true;
    auto operator<=>(const GraphKey&) const = default;
  };
  static constexpr size_t kMaxGraphs = 64;
  bool graphs_enabled_ = true;
  int32_t programmatic_max_rows_ = 2;  // CudaBackendConfig::programmatic_max_rows
  bool pingpong_prefill_ = true;        // CudaBackendConfig::pingpong_prefill
  bool step_programmatic_ = false;      // this step's kernels launch programmatically (plan_step)
  int32_t max_graph_rows_ = 256;
  bool wide_prefill_ = false;  // PlanShape::wide_prefill (CudaBackendConfig::wgmma_prefill)
  int32_t forked_wide_prefill_keys_ = 0;  // PlanShape::forked_wide_prefill_keys (0 without wide_prefill_)
  struct CapturedGraph {
    cudaGraphExec_t exec = nullptr;
    int64_t last_used = 0;  // graph_stats_ captures + replays at its last use
  };
  std::map<GraphKey, CapturedGraph> graphs_;
  std::vector<const void*> graph_buffers_;
  GraphStats graph_stats_;

  StepPlan plan_;
  PinnedBuffer plan_host_;
  cudaEvent_t plan_copied_ = nullptr;  // the last upload from plan_host_ is done once this fires
  DeviceBuffer plan_device_;
  PinnedBuffer logits_host_;
  int32_t lora_max_rank_ = 0;    // max_rank of the LoRA scratch this step
  int32_t lora_max_splits_ = 0;  // shrink chunks of the widest LoRA input
  cudaStream_t lora_stream_ = nullptr;
  cudaEvent_t lora_fork_ = nullptr, lora_join_ = nullptr;
  L2Prefetch l2_prefetch_;
  cudaStream_t prefetch_stream_ = nullptr;
  cudaEvent_t prefetch_fork_ = nullptr, prefetch_join_ = nullptr;
  bool prefetch_forked_ = false;  // this step launched a prefetch: stream_ joins prefetch_stream_ at its end
  bool step_prefetch_ = false;  // this step's launches are being captured and l2_prefetch_ asks for some
  // Forks a launch_prefetch_l2 of `ranges` off stream_ (after its work so far).
  void prefetch_l2(const L2PrefetchRanges& ranges);

  // Activations, grown on demand (never shrunk).
  DeviceBuffer residual_;   // [tokens, hidden] fp32
  DeviceBuffer delta_;      // [tokens, hidden] fp32: o_proj / down_proj output
  DeviceBuffer normed_;     // [tokens, hidden] bf16
  DeviceBuffer qkv_;        // [tokens, q + 2 kv] fp32
  DeviceBuffer q_;          // [tokens, q] bf16
  DeviceBuffer attention_out_;  // [tokens, q] bf16
  DeviceBuffer gate_up_;    // [tokens, 2 intermediate] bf16
  DeviceBuffer activation_; // [tokens, intermediate] bf16
  DeviceBuffer lora_v_;     // [3, lora rows, max rank] fp32
  DeviceBuffer lora_out_;   // [lora rows, widest group] fp32 (gate/up: bf16): the LoRA delta of one projection group
  DeviceBuffer partial_out_, partial_lse_;
  DeviceBuffer scratch_kv_;  // forked prefills on the wide kernel: [2][num_scratch_keys * kv_size] bf16 (K, V)
  DeviceBuffer logits_;     // [rows, vocab] fp32
  DeviceBuffer sampled_;    // [rows] int32 token ids, then [rows] fp32 logprobs (device sampling)
  PinnedBuffer sampled_host_;
  PinnedBuffer token_masks_host_;  // [Batch::num_token_mask_rows][words] uint32, filled by the caller
  DeviceBuffer token_masks_;
  PinnedBuffer logit_edits_host_;  // Batch::logit_edits
  DeviceBuffer logit_edits_;
  DeviceBuffer edit_originals_;    // [edits] fp32: each edited logit before its edit
  DeviceBuffer raw_lse_;           // [rows] fp32: log-sum-exp of each processed row before processing
  cudaEvent_t guided_copied_ = nullptr;  // the last uploads from the two pinned buffers above are done
  bool capture_hidden_states_ = false;  // the enqueued step's Batch::capture_hidden_states
  DeviceBuffer hidden_states_;  // [num_layers + 1][logit rows][hidden] fp32 when capturing
  void capture_hidden_states(int index, const float* lora_delta);
};

// make_synthetic_cuda_backend with the backend built by `construct` from
// CudaBackend's constructor arguments: for the benchmark's subclass (bench/cuda).
using CudaBackendConstructor = std::function<std::unique_ptr<CudaBackend>(
    const ModelConfig& config, DeviceModel model, cudaStream_t stream, int device,
    const CudaBackendConfig& backend_config)>;
std::unique_ptr<CudaBackend> make_synthetic_cuda_backend_as(const ModelConfig& config, uint64_t seed,
                                                            bool round_to_bf16,
                                                            const CudaBackendConfig& backend_config,
                                                            const CudaBackendConstructor& construct);

}  // namespace loom::cuda
