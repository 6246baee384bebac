#include "backend/cuda/cuda_backend_impl.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "backend/batch_checks.h"
#include "backend/cuda/cuda_check.h"
#include "util/error.h"

namespace loom {

namespace cuda {

namespace {

void check_model_supported(const ModelConfig& config) {
  check_model_capabilities(cuda_backend_capabilities(), config);
}


int current_sm_count(int device) {
  int count = 0;
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

}  // namespace

CudaBackend::CudaBackend(const ModelConfig& config, DeviceModel model, cudaStream_t stream, int device,
                         const CudaBackendConfig& backend_config)
    : config_(config), device_(device), stream_(stream), model_(std::move(model)) {
  num_sms_ = current_sm_count(device);
  decode_ctas_per_sm_ = attention_decode_ctas_per_sm(config_.head_dim);
  gemm_ = std::make_unique<Gemm>(stream_);
  LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&plan_copied_, cudaEventDisableTiming));
  LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&guided_copied_, cudaEventDisableTiming));
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&lora_stream_, cudaStreamNonBlocking));
  LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&lora_fork_, cudaEventDisableTiming));
  LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&lora_join_, cudaEventDisableTiming));
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&prefetch_stream_, cudaStreamNonBlocking));
  LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&prefetch_fork_, cudaEventDisableTiming));
  LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&prefetch_join_, cudaEventDisableTiming));
  graphs_enabled_ = backend_config.cuda_graphs;
  programmatic_max_rows_ = backend_config.programmatic_max_rows;
  pingpong_prefill_ = backend_config.pingpong_prefill;
  if (backend_config.l2_prefetch) l2_prefetch_ = {16 << 20, 8 << 20, 8 << 20, 2};
  max_graph_rows_ = backend_config.max_graph_rows;
  wide_prefill_ = backend_config.wgmma_prefill && attention_wide_supports_head_dim(config_.head_dim);
  forked_wide_prefill_keys_ = wide_prefill_ ? std::max(backend_config.forked_wide_prefill_keys, 0) : 0;
  adapters_.resize(backend_config.max_adapter_slots);
  kv_rank_of_slot_.assign(backend_config.max_adapter_slots, 0);
  lora_table_ = std::make_unique<DeviceLoraTable>(backend_config.max_adapter_slots, config_);
  spdlog::info("cuda backend: {} weights {:.2f} GiB on {}", architecture_hf_name(config_.arch),
               static_cast<double>(model_.weight_bytes()) / (1 << 30), cuda_device_description(device));
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(stream_);
  clear_graphs();
  gemm_.reset();
  if (plan_copied_ != nullptr) cudaEventDestroy(plan_copied_);
  if (guided_copied_ != nullptr) cudaEventDestroy(guided_copied_);
  cudaEventDestroy(lora_fork_);
  cudaEventDestroy(lora_join_);
  cudaStreamDestroy(lora_stream_);
  cudaEventDestroy(prefetch_fork_);
  cudaEventDestroy(prefetch_join_);
  cudaStreamDestroy(prefetch_stream_);
  cudaStreamDestroy(stream_);
}

int64_t CudaBackend::kv_bytes_per_token() const {
  return static_cast<int64_t>(config_.num_layers) * 2 * config_.kv_size() * static_cast<int64_t>(sizeof(__nv_bfloat16));
}

void CudaBackend::use_device() const {
  // The engine calls from its own threads; a thread's current device is 0 until it is set. Cheap
  // when already current, so set every time rather than trust a cache other code could outdate.
  LOOM_CUDA_CHECK(cudaSetDevice(device_));
}

void CudaBackend::allocate_kv_cache(const KvCacheShape& shape) {
  use_device();
  if (shape.num_blocks <= 0 || shape.block_size <= 0)
    fail(ErrorKind::kInvalidArgument, "cuda backend: KV cache of {} blocks of {} tokens", shape.num_blocks,
         shape.block_size);
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  clear_graphs();  // they hold per-layer pool addresses and the block size
  kv_pool_.release();
  kv_shape_ = {0, 0};
  const int64_t bytes = static_cast<int64_t>(shape.num_blocks) * shape.block_size * kv_bytes_per_token();
  try {
    kv_pool_.allocate(static_cast<size_t>(bytes));
  } catch (const Error& error) {
    throw Error(ErrorKind::kCapacity,
                fmt::format("cuda backend: cannot allocate a KV cache of {} bytes ({} blocks): {}", bytes,
                            shape.num_blocks, error.message()),
                "lower --kv-cache-bytes");
  }
  // Zeros: a slot read before it is written (never, for a correct batch) gives no NaN.
  LOOM_CUDA_CHECK(cudaMemsetAsync(kv_pool_.data(), 0, kv_pool_.size(), stream_));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  kv_shape_ = shape;
}

__nv_bfloat16* CudaBackend::k_pool(int layer) const {
  if (kv_pool_.data() == nullptr) return nullptr;
  const int64_t pool_elements = static_cast<int64_t>(kv_shape_.num_blocks) * kv_shape_.block_size * config_.kv_size();
  return kv_pool_.as<__nv_bfloat16>() + (2LL * layer) * pool_elements;
}

int64_t CudaBackend::residual_bytes_per_token(int32_t max_rank) const {
  return static_cast<int64_t>(config_.num_layers) * 2 * residual_rank_stride(max_rank) *
         static_cast<int64_t>(sizeof(__nv_bfloat16));
}

void CudaBackend::allocate_residual_cache(const ResidualCacheShape& shape) {
  use_device();
  if (shape.num_blocks <= 0 || shape.block_size <= 0 || shape.max_rank <= 0)
    fail(ErrorKind::kInvalidArgument, "cuda backend: residual cache of {} blocks of {} tokens, max rank {}",
         shape.num_blocks, shape.block_size, shape.max_rank);
  if (shape.max_rank > kResidualMaxRank)
    throw Error(ErrorKind::kUnsupported,
                fmt::format("cuda backend: residual cache of max rank {} (ResidualAttention runs k/v ranks up to {})",
                            shape.max_rank, kResidualMaxRank),
                fmt::format("serve forked adapters of k/v rank <= {}, or use --device cpu", kResidualMaxRank));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  clear_graphs();
  residual_pool_.release();
  residual_shape_ = {0, 0, 0};
  residual_rank_stride_ = 0;
  const int64_t bytes = static_cast<int64_t>(shape.num_blocks) * shape.block_size * residual_bytes_per_token(shape.max_rank);
  try {
    residual_pool_.allocate(static_cast<size_t>(bytes));
  } catch (const Error& error) {
    throw Error(ErrorKind::kCapacity,
                fmt::format("cuda backend: cannot allocate a residual cache of {} bytes ({} blocks): {}", bytes,
                            shape.num_blocks, error.message()),
                "lower --residual-kv-cache-memory");
  }
  LOOM_CUDA_CHECK(cudaMemsetAsync(residual_pool_.data(), 0, residual_pool_.size(), stream_));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  residual_shape_ = shape;
  residual_rank_stride_ = residual_rank_stride(shape.max_rank);
  // Forked prefills on the wide kernel rebuild K/V into scratch (CudaBackendConfig::
  // forked_wide_prefill_keys): taken here, beside the rCache, so that a step never
  // allocates it when the KV pools have filled the GPU.
  const size_t scratch_bytes =
      2 * static_cast<size_t>(forked_wide_prefill_keys_) * config_.kv_size() * sizeof(__nv_bfloat16);
  if (scratch_kv_.size() < scratch_bytes) {
    try {
      scratch_kv_.allocate(scratch_bytes);
    } catch (const Error& error) {
      throw Error(ErrorKind::kCapacity,
                  fmt::format("cuda backend: cannot allocate {} bytes of forked prefill scratch: {}", scratch_bytes,
                              error.message()),
                  "lower --residual-kv-cache-memory or the KV cache's share of GPU memory");
    }
  }
}

__nv_bfloat16* CudaBackend::residual_pool(int layer) const {
  if (residual_pool_.data() == nullptr) return nullptr;
  const int64_t pool_elements =
      static_cast<int64_t>(residual_shape_.num_blocks) * residual_shape_.block_size * 2 * residual_rank_stride_;
  return residual_pool_.as<__nv_bfloat16>() + layer * pool_elements;
}

__nv_bfloat16* CudaBackend::v_pool(int layer) const {
  if (kv_pool_.data() == nullptr) return nullptr;
  const int64_t pool_elements = static_cast<int64_t>(kv_shape_.num_blocks) * kv_shape_.block_size * config_.kv_size();
  return kv_pool_.as<__nv_bfloat16>() + (2LL * layer + 1) * pool_elements;
}

void CudaBackend::set_adapter(int32_t slot, std::shared_ptr<const LoraAdapter> adapter) {
  use_device();
  if (slot < 0 || slot >= max_adapter_slots())
    fail(ErrorKind::kInvalidArgument, "cuda backend: adapter slot {} outside [0, {})", slot, max_adapter_slots());
  if (adapter != nullptr) {
    validate_adapter(*adapter, config_);
    if (adapter->max_rank() > kLoraMaxRank)
      fail(ErrorKind::kUnsupported, "adapter '{}': rank {} above the cuda backend's {}", adapter->name,
           adapter->max_rank(), kLoraMaxRank);
  }
  lora_table_->set(slot, adapter.get(), stream_);
  kv_rank_of_slot_[slot] = adapter != nullptr ? adapter->max_kv_rank() : 0;
  adapters_[slot] = std::move(adapter);
}

void CudaBackend::grow_buffers() {
  const size_t n = static_cast<size_t>(plan_.num_rows());
  const size_t hidden = config_.hidden_size;
  const size_t q_size = config_.q_size();
  const size_t qkv = q_size + 2 * config_.kv_size();
  const size_t intermediate = config_.intermediate_size;
  residual_.reserve(n * hidden * sizeof(float));
  delta_.reserve(n * hidden * sizeof(float));
  normed_.reserve(n * hidden * sizeof(__nv_bfloat16));
  qkv_.reserve(n * qkv * sizeof(float));
  q_.reserve(n * q_size * sizeof(__nv_bfloat16));
  attention_out_.reserve(n * q_size * sizeof(__nv_bfloat16));
  gate_up_.reserve(n * 2 * intermediate * sizeof(__nv_bfloat16));
  activation_.reserve(n * intermediate * sizeof(__nv_bfloat16));
  lora_max_rank_ = lora_table_->max_rank();
  lora_max_splits_ = lora_splits(std::max({config_.hidden_size, config_.q_size(), config_.intermediate_size}));
  if (plan_.num_lora_rows() > 0) {
    lora_v_.reserve(3 * static_cast<size_t>(lora_max_splits_) * plan_.num_lora_rows() * lora_max_rank_ * sizeof(float));
    lora_out_.reserve(static_cast<size_t>(plan_.num_lora_rows()) * std::max({qkv, 2 * intermediate, hidden}) *
                      sizeof(float));
  }
  const size_t partial_rows = static_cast<size_t>(plan_.num_partials()) * config_.num_kv_heads * kAttentionMaxRows;
  if (partial_rows > 0) {
    partial_out_.reserve(partial_rows * config_.head_dim * sizeof(float));
    partial_lse_.reserve(partial_rows * sizeof(float));
  }
  // The scratch was taken with the rCache for the plan's whole budget (allocate_residual_cache).
  LOOM_CHECK(2 * static_cast<size_t>(plan_.num_scratch_keys()) * config_.kv_size() * sizeof(__nv_bfloat16) <=
             scratch_kv_.size());
  const size_t logit_rows = static_cast<size_t>(plan_.num_logit_launch_rows());
  logits_.reserve(logit_rows * static_cast<size_t>(config_.vocab_size) * sizeof(float));
  sampled_.reserve(logit_rows * 2 * sizeof(int32_t));
  if (capture_hidden_states_)
    hidden_states_.reserve((config_.num_layers + 1) * plan_.logit_rows().size() * hidden * sizeof(float));
  plan_device_.reserve(plan_.words().size() * sizeof(int32_t));
  plan_host_.reserve(plan_.words().size() * sizeof(int32_t));
}

void CudaBackend::linear(const __nv_bfloat16* x, int32_t m, int32_t k, const __nv_bfloat16* w, int32_t n, void* y,
                         bool y_is_bf16, int32_t y_stride) {
  if (decode_gemm_ == DecodeGemm::kAuto && m <= skinny_max_rows_) {
    launch_skinny_gemm(x, m, k, w, n, k, y, y_is_bf16, y_stride, chain());
    return;
  }
  gemm_->linear(x, m, k, w, n, y, y_is_bf16 ? Gemm::Output::kBF16 : Gemm::Output::kF32, y_stride);
}

int CudaBackend::begin_lora(int layer, std::initializer_list<LoraTarget> targets, const __nv_bfloat16* x,
                             int32_t x_stride, int32_t width) {
  if (plan_.num_lora_tiles() == 0) return kLoraNone;
  const PlanSections& sections = plan_.sections();
  LoraParams params;
  params.modules = lora_table_->device_table();
  params.num_layers = config_.num_layers;
  params.layer = layer;
  params.sorted_tokens = plan_pointer<int32_t>(sections.lora_tokens);
  params.tiles = plan_pointer<LoraTile>(sections.lora_tiles);
  params.num_tiles = plan_.num_lora_tiles();
  params.num_rows = plan_.num_lora_rows();
  params.max_rank = lora_max_rank_;
  params.x = x;
  params.x_stride = x_stride;
  params.v = lora_v_.as<float>();
  params.max_splits = lora_max_splits_;
  params.y = lora_out_.data();
  // gate/up's delta (the widest, read by SwiGLU, which rounds to bf16 anyway) travels as bf16.
  params.y_is_bf16 = lora_bf16_gate_up_ && *targets.begin() == LoraTarget::kGate;
  params.y_stride = width;
  params.write_by_lora_row = true;
  const int32_t hidden = config_.hidden_size;
  const int32_t q_size = config_.q_size();
  const int32_t kv_size = config_.kv_size();
  const int32_t intermediate = config_.intermediate_size;
  for (LoraTarget target : targets) {
    LoraTargetArgs& args = params.targets[params.num_targets++];
    args.target = static_cast<int32_t>(target);
    switch (target) {
      case LoraTarget::kQ: args = {args.target, hidden, q_size, 0}; break;
      case LoraTarget::kK: args = {args.target, hidden, kv_size, q_size}; break;
      case LoraTarget::kV: args = {args.target, hidden, kv_size, q_size + kv_size}; break;
      case LoraTarget::kO: args = {args.target, q_size, hidden, 0}; break;
      case LoraTarget::kGate: args = {args.target, hidden, intermediate, 0}; break;
      case LoraTarget::kUp: args = {args.target, hidden, intermediate, intermediate}; break;
      case LoraTarget::kDown: args = {args.target, intermediate, hidden, 0}; break;
    }
  }
  params.programmatic_expand = lora_overlap_ == LoraOverlap::kSideStreamPdl;
  const int32_t first = params.targets[0].target;
  const int group = first == static_cast<int32_t>(LoraTarget::kQ)      ? 0
                    : first == static_cast<int32_t>(LoraTarget::kO)    ? 1
                    : first == static_cast<int32_t>(LoraTarget::kGate) ? 2
                                                                       : 3;
  params.expand_columns = lora_expand_columns_;
  params.fused = lora_kernel_ == LoraKernel::kFused || (lora_kernel_ == LoraKernel::kFusedAttention && group <= 1);
  // The rCache writes read the split path's shrink sums (QkvParams::lora_v).
  if (group == 0 && plan_.has_residual_writes()) params.fused = false;
  if (lora_overlap_ == LoraOverlap::kInline || (lora_side_groups_ >> group & 1) == 0) {
    launch_lora_group(group, params, chain());
    return kLoraInline;
  }
  // The shrink and expand read x and write only lora_out_: they overlap the base GEMM.
  LOOM_CUDA_CHECK(cudaEventRecord(lora_fork_, stream_));
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(lora_stream_, lora_fork_, 0));
  launch_lora_group(group, params, lora_stream_);
  LOOM_CUDA_CHECK(cudaEventRecord(lora_join_, lora_stream_));
  return kLoraSide;
}

void CudaBackend::prefetch_l2(const L2PrefetchRanges& ranges) {
  LOOM_CUDA_CHECK(cudaEventRecord(prefetch_fork_, stream_));
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(prefetch_stream_, prefetch_fork_, 0));
  launch_prefetch_l2(ranges, prefetch_stream_);
  prefetch_forked_ = true;
}

const float* CudaBackend::end_lora(int active) {
  if (active == kLoraNone) return nullptr;
  if (active == kLoraSide) LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream_, lora_join_, 0));
  return lora_out_.as<float>();
}

const float* CudaBackend::run_layer(int layer, const float* previous_lora_delta) {
  const DeviceLayer& weights = model_.layers()[layer];
  const PlanSections& sections = plan_.sections();
  const int32_t n = plan_.num_rows();  // tokens, then decoder rows
  const int32_t hidden = config_.hidden_size;
  const int32_t q_size = config_.q_size();
  const int32_t kv_size = config_.kv_size();
  const int32_t qkv = q_size + 2 * kv_size;
  const int32_t intermediate = config_.intermediate_size;
  using bf16 = __nv_bfloat16;

  // Input norm; from layer 1 on it first adds the previous MLP's output.
  const int32_t* lora_rows = plan_pointer<int32_t>(sections.lora_row_of_token);
  launch_add_rms_norm(residual_.as<float>(), layer == 0 ? nullptr : delta_.as<float>(), nullptr, weights.input_norm,
                      config_.rms_norm_eps, hidden, nullptr, n, normed_.as<bf16>(), chain(), previous_lora_delta,
                      lora_rows);
  int lora = begin_lora(layer, {LoraTarget::kQ, LoraTarget::kK, LoraTarget::kV}, normed_.as<bf16>(), hidden, qkv);
  linear(normed_.as<bf16>(), n, hidden, weights.qkv_proj, qkv, qkv_.data(), false, qkv);
  if (step_prefetch_) {
    const int64_t half = l2_prefetch_.gate_up / 2;
    const int64_t gate_bytes = static_cast<int64_t>(intermediate) * hidden * sizeof(bf16);
    prefetch_l2({{{weights.o_proj, std::min<int64_t>(l2_prefetch_.o_proj, int64_t{hidden} * q_size * sizeof(bf16))},
                  {weights.gate_up_proj, std::min(half, gate_bytes)},
                  {weights.gate_up_proj + static_cast<int64_t>(intermediate) * hidden, std::min(half, gate_bytes)}}});
  }

  QkvParams post;
  post.qkv = qkv_.as<float>();
  post.bias = config_.qkv_bias ? weights.qkv_bias : nullptr;
  post.q_norm = config_.qk_norm ? weights.q_norm : nullptr;
  post.k_norm = config_.qk_norm ? weights.k_norm : nullptr;
  post.inv_freq = model_.inverse_frequencies();
  post.positions = plan_pointer<int32_t>(sections.positions);
  post.kv_slots = plan_pointer<int32_t>(sections.kv_slots);
  post.q_out = q_.as<bf16>();
  post.k_cache = k_pool(layer);
  post.v_cache = v_pool(layer);
  post.num_tokens = n;
  post.num_heads = config_.num_heads;
  post.num_kv_heads = config_.num_kv_heads;
  post.head_dim = config_.head_dim;
  post.block_size = kv_shape_.block_size;
  post.eps = config_.rms_norm_eps;
  post.lora = end_lora(lora);
  post.lora_rows = lora_rows;
  if (plan_.has_forked_sequences()) {
    post.residual_slots = plan_pointer<int32_t>(sections.residual_slots);
    post.residual_pool = residual_pool(layer);
    post.residual_rank_stride = residual_rank_stride_;
    post.lora_v = lora_v_.as<float>();
    post.lora_num_rows = plan_.num_lora_rows();
    post.lora_max_rank = lora_max_rank_;
    post.lora_max_splits = lora_max_splits_;
    post.lora_splits = lora_splits(hidden);
    post.lora_modules = lora_table_->device_table();
    post.row_adapter_slots = plan_pointer<int32_t>(sections.row_adapter_slots);
    post.num_layers = config_.num_layers;
    post.layer = layer;
  }
  launch_qkv_postprocess(post, chain());

  AttentionParams attention;
  attention.q = q_.as<bf16>();
  attention.k_cache = k_pool(layer);
  attention.v_cache = v_pool(layer);
  attention.block_tables = plan_pointer<int32_t>(sections.block_tables);
  attention.sequences = plan_pointer<AttentionSequence>(sections.sequences);
  attention.out = attention_out_.as<bf16>();
  attention.partial_out = partial_out_.as<float>();
  attention.partial_lse = partial_lse_.as<float>();
  attention.num_heads = config_.num_heads;
  attention.num_kv_heads = config_.num_kv_heads;
  attention.head_dim = config_.head_dim;
  attention.block_size = kv_shape_.block_size;
  attention.scale = 1.0f / std::sqrt(static_cast<float>(config_.head_dim));
  AttentionVariant prefill = plan_.prefill_variant();
  if (prefill == AttentionVariant::kPrefillWide && pingpong_prefill_) prefill = AttentionVariant::kPrefillWidePingPong;
  launch_attention(attention, prefill, plan_pointer<AttentionWorkItem>(sections.prefill_items),
                   plan_.num_prefill_items(), chain());
  launch_attention(attention, AttentionVariant::kDecode, plan_pointer<AttentionWorkItem>(sections.decode_items),
                   plan_.num_decode_items(), chain());
  if (plan_.has_forked_sequences()) {
    attention.residual_pool = residual_pool(layer);
    attention.residual_block_tables = plan_pointer<int32_t>(sections.residual_block_tables);
    attention.residual_block_size = residual_shape_.block_size;
    attention.residual_rank_stride = residual_rank_stride_;
    attention.lora_modules = lora_table_->device_table();
    attention.num_layers = config_.num_layers;
    attention.layer = layer;
    attention.inv_freq = model_.inverse_frequencies();
    launch_attention(attention, AttentionVariant::kPrefill,
                     plan_pointer<AttentionWorkItem>(sections.forked_prefill_items), plan_.num_forked_prefill_items(),
                     stream_, residual_rank_);
    launch_attention(attention, AttentionVariant::kDecode, plan_pointer<AttentionWorkItem>(sections.forked_decode_items),
                     plan_.num_forked_decode_items(), stream_, residual_rank_);
    bf16* scratch_k = scratch_kv_.as<bf16>();
    launch_forked_wide_prefill(attention, plan_pointer<ResidualRebuildItem>(sections.rebuild_items),
                               plan_.num_rebuild_items(), plan_pointer<AttentionWorkItem>(sections.forked_wide_items),
                               plan_.num_forked_wide_items(), scratch_k,
                               scratch_k + static_cast<size_t>(plan_.num_scratch_keys()) * config_.kv_size(), stream_,
                               residual_rank_, pingpong_prefill_ ? AttentionVariant::kPrefillWidePingPong
                                                                 : AttentionVariant::kPrefillWide);
  }
  launch_attention_combine(attention, plan_pointer<AttentionCombineItem>(sections.combine_items),
                           plan_.num_combine_items(), chain());

  lora = begin_lora(layer, {LoraTarget::kO}, attention_out_.as<bf16>(), q_size, hidden);
  linear(attention_out_.as<bf16>(), n, q_size, weights.o_proj, hidden, delta_.data(), false, hidden);
  launch_add_rms_norm(residual_.as<float>(), delta_.as<float>(), config_.o_bias ? weights.o_bias : nullptr,
                      weights.post_attention_norm, config_.rms_norm_eps, hidden, nullptr, n, normed_.as<bf16>(),
                      chain(), end_lora(lora), lora_rows);

  // With no LoRA to add between the projection and SwiGLU, decode steps use one fused kernel.
  const bool no_lora = plan_.num_lora_tiles() == 0;
  if (no_lora && decode_gemm_ == DecodeGemm::kAuto && n <= skinny_max_rows_) {
    launch_skinny_gate_up_swiglu(normed_.as<bf16>(), n, hidden, weights.gate_up_proj, intermediate, hidden,
                                 activation_.as<bf16>(), chain());
  } else {
    lora = begin_lora(layer, {LoraTarget::kGate, LoraTarget::kUp}, normed_.as<bf16>(), hidden, 2 * intermediate);
    linear(normed_.as<bf16>(), n, hidden, weights.gate_up_proj, 2 * intermediate, gate_up_.data(), true,
           2 * intermediate);
    launch_swiglu(gate_up_.as<bf16>(), n, intermediate, activation_.as<bf16>(), chain(), end_lora(lora), lora_rows,
                  lora_bf16_gate_up_);
  }
  lora = begin_lora(layer, {LoraTarget::kDown}, activation_.as<bf16>(), intermediate, hidden);
  linear(activation_.as<bf16>(), n, intermediate, weights.down_proj, hidden, delta_.data(), false, hidden);
  if (step_prefetch_ && l2_prefetch_.qkv > 0) {
    const bool last = layer + 1 == config_.num_layers;
    const bf16* next = last ? model_.lm_head() : model_.layers()[layer + 1].qkv_proj;
    const int64_t rows = last ? config_.vocab_size : qkv;
    prefetch_l2({{{next, std::min<int64_t>(l2_prefetch_.qkv, rows * hidden * static_cast<int64_t>(sizeof(bf16)))}}});
  }
  return end_lora(lora);  // added by the next norm, with delta_
}

void CudaBackend::capture_hidden_states(int index, const float* lora_delta) {
  const int32_t num_rows = static_cast<int32_t>(plan_.logit_rows().size());
  const PlanSections& sections = plan_.sections();
  launch_gather_hidden(residual_.as<float>(), index == 0 ? nullptr : delta_.as<float>(), lora_delta,
                       plan_pointer<int32_t>(sections.lora_row_of_token), plan_pointer<int32_t>(sections.logit_rows),
                       num_rows, config_.hidden_size,
                       hidden_states_.as<float>() + static_cast<int64_t>(index) * num_rows * config_.hidden_size,
                       chain());
}

}  // namespace cuda

namespace {

cudaStream_t make_stream(int device) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw Error(ErrorKind::kUnsupported,
                fmt::format("--device cuda: no CUDA GPU available ({})",
                            status != cudaSuccess ? cudaGetErrorString(status) : "0 devices"),
                "run on a machine with an NVIDIA GPU, or use --device cpu");
  }
  if (device < 0 || device >= count)
    fail(ErrorKind::kInvalidArgument, "--device cuda: GPU {} outside the {} present", device, count);
  LOOM_CUDA_CHECK(cudaSetDevice(device));
  int major = 0;
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major < 9)
    throw Error(ErrorKind::kUnsupported, fmt::format("--device cuda: {} is not a Hopper GPU", cuda_device_description(device)),
                "this build's kernels are compiled for sm_90a (H100/H200)");
  cudaStream_t stream = nullptr;
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return stream;
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const ModelConfig& config, const ModelWeights& weights,
                                           const CudaBackendConfig& backend_config) {
  if (has_quantized_tensors(weights))
    throw Error(ErrorKind::kUnsupported, "--device cuda: weights kept in a GGUF block format",
                "load the model with fp32 weights (--cpu-precision fp32 keeps them so)");
  validate_weights(weights, config);
  cuda::check_model_supported(config);
  cudaStream_t stream = make_stream(backend_config.device);
  try {
    cuda::DeviceModel model = cuda::DeviceModel::upload(config, weights, stream);
    return std::make_unique<cuda::CudaBackend>(config, std::move(model), stream, backend_config.device, backend_config);
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
}

std::unique_ptr<cuda::CudaBackend> cuda::make_synthetic_cuda_backend_as(const ModelConfig& config, uint64_t seed,
                                                                       bool round_to_bf16,
                                                                       const CudaBackendConfig& backend_config,
                                                                       const CudaBackendConstructor& construct) {
  cuda::check_model_supported(config);
  cudaStream_t stream = make_stream(backend_config.device);
  try {
    cuda::DeviceModel model = cuda::DeviceModel::synthetic(config, seed, round_to_bf16, stream);
    return construct(config, std::move(model), stream, backend_config.device, backend_config);
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
}

std::unique_ptr<Backend> make_synthetic_cuda_backend(const ModelConfig& config, uint64_t seed, bool round_to_bf16,
                                                     const CudaBackendConfig& backend_config) {
  return cuda::make_synthetic_cuda_backend_as(
      config, seed, round_to_bf16, backend_config,
      [](const ModelConfig& model_config, cuda::DeviceModel model, cudaStream_t stream, int device,
         const CudaBackendConfig& config_of_backend) {
        return std::make_unique<cuda::CudaBackend>(model_config, std::move(model), stream, device, config_of_backend);
      });
}

BackendCapabilities cuda_backend_capabilities() {
  BackendCapabilities capabilities;
  capabilities.name = "cuda";
  capabilities.kv_sharing_modes = all_kv_sharing_modes();
  capabilities.max_residual_rank = cuda::kResidualMaxRank;
  for (int32_t head_dim = 1; head_dim <= 1024; ++head_dim)
    if (cuda::attention_supports_head_dim(head_dim)) capabilities.head_dims.push_back(head_dim);
  capabilities.dimension_multiple = 8;  // the LoRA and skinny GEMM kernels' 16-byte loads
  capabilities.max_lora_rank = cuda::kLoraMaxRank;
  capabilities.device_sampling = true;
  capabilities.device_token_masks = true;
  capabilities.device_logit_processing = true;
  capabilities.host_kv_tier = true;
  capabilities.residual_host_kv_tier = true;
  capabilities.capture_hidden_states = true;
  return capabilities;
}

std::string cuda_device_description(int device) {
  cudaDeviceProp properties{};
  const cudaError_t status = cudaGetDeviceProperties(&properties, device);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorKind::kUnsupported, fmt::format("no CUDA GPU {}: {}", device, cudaGetErrorString(status)));
  }
  return fmt::format("{} ({} SMs, {:.1f} GiB, sm_{}{})", properties.name, properties.multiProcessorCount,
                     static_cast<double>(properties.totalGlobalMem) / (1 << 30), properties.major, properties.minor);
}

int64_t cuda_free_memory_bytes(int device) {
  LOOM_CUDA_CHECK(cudaSetDevice(device));
  size_t free_bytes = 0, total_bytes = 0;
  LOOM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(free_bytes);
}

int64_t cuda_total_memory_bytes(int device) {
  LOOM_CUDA_CHECK(cudaSetDevice(device));
  size_t free_bytes = 0, total_bytes = 0;
  LOOM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(total_bytes);
}

}  // namespace loom
