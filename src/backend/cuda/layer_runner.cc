#include "backend/cuda/layer_runner.h"

#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_communicator.h"

namespace loom::cuda {

using bf16 = __nv_bfloat16;

#ifdef LOOM_CUDA_MEASURE
bool LayerRunner::skipped(uint32_t bit) const { return (parts_.lora.measure().skip_kernels & bit) != 0; }
#else
bool LayerRunner::skipped(uint32_t) const { return false; }
#endif

void LayerRunner::linear(const bf16* x, int32_t m, int32_t k, const bf16* w, int32_t n, void* y, bool y_is_bf16,
                         int32_t y_stride, const Fp8Matrix& fp8) {
  if (fp8.data != nullptr) {
    if (m <= parts_.tuning.skinny_max_rows) {
      launch_skinny_gemm_fp8(x, m, k, fp8.data, fp8.scale, n, k, y, y_is_bf16, y_stride, chain());
      return;
    }
    const Gemm::Output output = y_is_bf16 ? Gemm::Output::kBF16 : Gemm::Output::kF32;
    const Gemm::Fp8Scaling scaling = fp8.per_channel ? Gemm::Fp8Scaling::kChannel : Gemm::Fp8Scaling::kTensor;
    StepBuffers& buffers = parts_.buffers;
    if (parts_.gemm.supports_fp8(m, k, n, output, y_stride, scaling)) {
      // W8A8: the activations quantized with one dynamic scale (as vLLM's per-tensor
      // dynamic fp8), then cuBLASLt's FP8 GEMM.
      uint8_t* xq = buffers.fp8_activations.as<uint8_t>();
      float* x_scale = buffers.fp8_activation_scales.as<float>();
      launch_fp8_quantize_tensor(x, m, k, k, xq, x_scale, 1, reinterpret_cast<uint32_t*>(x_scale + 1), step_.stream);
      parts_.gemm.linear_fp8(xq, x_scale, m, k, fp8.data, fp8.scale, scaling, n, y, output, y_stride);
      return;
    }
    // W8A16 for shapes cuBLASLt's FP8 GEMM refuses: the matrix dequantized to bf16.
    bf16* dequantized = buffers.fp8_weight.as<bf16>();
    launch_fp8_dequantize(fp8.data, fp8.scale, n, k, dequantized, step_.stream);
    parts_.gemm.linear(x, m, k, dequantized, n, y, output, y_stride);
    return;
  }
  if (m <= parts_.tuning.skinny_max_rows) {
    launch_skinny_gemm(x, m, k, w, n, k, y, y_is_bf16, y_stride, chain());
    return;
  }
  parts_.gemm.linear(x, m, k, w, n, y, y_is_bf16 ? Gemm::Output::kBF16 : Gemm::Output::kF32, y_stride);
}

void LayerRunner::enqueue(const StepLaunch& step) {
  step_ = step;
  const StepPlan& plan = parts_.plan.plan();
  const PlanSections& sections = plan.sections();
  const ModelConfig& config = parts_.config;
  StepBuffers& buffers = parts_.buffers;
  const int32_t n = plan.num_rows();
  const int32_t hidden = config.hidden_size;
  parts_.prefetcher.begin_step(step_.stream, n);
  launch_embedding(plan_pointer<int32_t>(sections.token_ids), n, parts_.model.embed_tokens(), hidden,
                   buffers.residual.as<float>(), step_.stream, parts_.rank.shard.vocab_begin, config.vocab_size);
  if (parts_.rank.communicator != nullptr)
    parts_.rank.communicator->all_reduce_sum(buffers.residual.as<float>(), static_cast<int64_t>(n) * hidden,
                                             step_.stream);
  if (step_.capture_hidden_states) capture_hidden_states(0, nullptr);
  const float* lora_delta = nullptr;
  for (int layer = 0; layer < config.num_layers; ++layer) {
    lora_delta = run_layer(layer, lora_delta);
    if (step_.capture_hidden_states) capture_hidden_states(layer + 1, lora_delta);
  }
  const int32_t num_rows = plan.num_logit_launch_rows();
  launch_add_rms_norm(buffers.residual.as<float>(), buffers.delta.as<float>(), nullptr, parts_.model.final_norm(),
                      config.rms_norm_eps, hidden, plan_pointer<int32_t>(sections.logit_rows), num_rows,
                      buffers.normed.as<bf16>(), chain(), lora_delta, plan_pointer<int32_t>(sections.lora_row_of_token));
  linear(buffers.normed.as<bf16>(), num_rows, hidden, parts_.model.lm_head(), config.vocab_size, buffers.logits.data(),
         false, config.vocab_size);
}

const float* LayerRunner::run_layer(int layer, const float* previous_lora_delta) {
  const DeviceLayer& weights = parts_.model.layers()[layer];
  const StepPlan& plan = parts_.plan.plan();
  const PlanSections& sections = plan.sections();
  const ModelConfig& config = parts_.config;
  const LayerSpec& spec = parts_.layer;
  StepBuffers& buffers = parts_.buffers;
  LoraLauncher& lora = parts_.lora;
  const int32_t n = plan.num_rows();  // tokens, then decoder rows
  const int32_t hidden = spec.hidden_size;
  const int32_t q_size = spec.q_size();
  const int32_t qkv = q_size + 2 * spec.kv_size();
  const int32_t intermediate = spec.intermediate_size;
  const cudaStream_t stream = step_.stream;

  // Input norm; from layer 1 on it first adds the previous MLP's output.
  const int32_t* lora_rows = plan_pointer<int32_t>(sections.lora_row_of_token);
  if (!skipped(kSkipNorms))
    launch_add_rms_norm(buffers.residual.as<float>(), layer == 0 ? nullptr : buffers.delta.as<float>(), nullptr,
                        weights.input_norm, spec.rms_norm_eps, hidden, nullptr, n, buffers.normed.as<bf16>(), chain(),
                        previous_lora_delta, lora_rows);
  auto pending = lora.begin(parts_.plan, layer, {LoraTarget::kQ, LoraTarget::kK, LoraTarget::kV},
                            buffers.normed.as<bf16>(), hidden, qkv, chain());
  linear(buffers.normed.as<bf16>(), n, hidden, weights.qkv_proj, qkv, buffers.qkv.data(), false, qkv, weights.qkv_fp8);
  parts_.prefetcher.after_qkv(weights, stream);

  QkvParams post;
  post.qkv = buffers.qkv.as<float>();
  post.bias = spec.qkv_bias ? weights.qkv_bias : nullptr;
  post.q_norm = spec.qk_norm ? weights.q_norm : nullptr;
  post.k_norm = spec.qk_norm ? weights.k_norm : nullptr;
  post.inv_freq = parts_.model.inverse_frequencies();
  post.positions = plan_pointer<int32_t>(sections.positions);
  post.kv_slots = plan_pointer<int32_t>(sections.kv_slots);
  post.q_out = buffers.q.as<bf16>();
  post.k_cache = parts_.pools.k_pool(layer);
  post.v_cache = parts_.pools.v_pool(layer);
  post.k_cache_fp8 = parts_.pools.k_pool_fp8(layer);
  post.v_cache_fp8 = parts_.pools.v_pool_fp8(layer);
  post.k_scale = parts_.pools.k_scale(layer);
  post.v_scale = parts_.pools.v_scale(layer);
  post.num_tokens = n;
  post.num_heads = spec.num_heads;
  post.num_kv_heads = spec.num_kv_heads;
  post.head_dim = spec.head_dim;
  post.block_size = parts_.pools.main_shape().block_size;
  post.eps = spec.rms_norm_eps;
  post.lora = lora.end(pending, stream);
  post.lora_rows = lora_rows;
  if (plan.has_forked_sequences()) {
    post.residual_slots = plan_pointer<int32_t>(sections.residual_slots);
    post.residual_pool = parts_.pools.residual_pool(layer);
    post.residual_rank_stride = parts_.pools.residual_rank_stride();
    post.lora_v = lora.shrink_sums();
    post.lora_num_rows = plan.num_lora_rows();
    post.lora_max_rank = lora.max_rank();
    post.lora_max_splits = lora.max_splits();
    post.lora_splits = lora_splits(hidden);
    post.lora_modules = lora.device_table();
    post.row_adapter_slots = plan_pointer<int32_t>(sections.row_adapter_slots);
    post.num_layers = config.num_layers;
    post.layer = layer;
  }
  if (!skipped(kSkipQkv)) launch_qkv_postprocess(post, chain());
  if (step_.kv_listener != nullptr) {  // this layer's K/V (and rCache) writes are all enqueued
    LOOM_CUDA_CHECK(cudaEventRecord(step_.layer_events[layer], stream));
    KvLayerFence fence;
    fence.event = step_.layer_events[layer];
    fence.rank = parts_.rank.shard.rank;
    step_.kv_listener->layer_written(layer, fence);
  }

  if (!skipped(kSkipAttention)) attention(layer);

  pending = lora.begin(parts_.plan, layer, {LoraTarget::kO}, buffers.attention_out.as<bf16>(), q_size, hidden, chain());
  linear(buffers.attention_out.as<bf16>(), n, q_size, weights.o_proj, hidden, buffers.delta.data(), false, hidden,
         weights.o_fp8);
  const float* o_lora = reduce_delta(lora.end(pending, stream));
  if (!skipped(kSkipNorms))
    launch_add_rms_norm(buffers.residual.as<float>(), buffers.delta.as<float>(), spec.o_bias ? weights.o_bias : nullptr,
                        weights.post_attention_norm, spec.rms_norm_eps, hidden, nullptr, n, buffers.normed.as<bf16>(),
                        chain(), o_lora, lora_rows);

  // With no LoRA to add between the projection and SwiGLU, skinny steps use one fused kernel.
  const bool fused_swiglu = plan.num_lora_tiles() == 0 && n <= parts_.tuning.skinny_max_rows;
  if (fused_swiglu && weights.gate_up_fp8.data != nullptr) {
    launch_skinny_gate_up_swiglu_fp8(buffers.normed.as<bf16>(), n, hidden, weights.gate_up_fp8.data,
                                     weights.gate_up_fp8.scale, intermediate, hidden, buffers.activation.as<bf16>(),
                                     chain());
  } else if (fused_swiglu && weights.gate_up_proj != nullptr) {
    launch_skinny_gate_up_swiglu(buffers.normed.as<bf16>(), n, hidden, weights.gate_up_proj, intermediate, hidden,
                                 buffers.activation.as<bf16>(), chain());
  } else {
    pending = lora.begin(parts_.plan, layer, {LoraTarget::kGate, LoraTarget::kUp}, buffers.normed.as<bf16>(), hidden,
                         2 * intermediate, chain());
    linear(buffers.normed.as<bf16>(), n, hidden, weights.gate_up_proj, 2 * intermediate, buffers.gate_up.data(), true,
           2 * intermediate, weights.gate_up_fp8);
    const float* gate_up_lora = lora.end(pending, stream);
    if (!skipped(kSkipSwiglu))
      launch_swiglu(buffers.gate_up.as<bf16>(), n, intermediate, buffers.activation.as<bf16>(), chain(), gate_up_lora,
                    lora_rows, lora.gate_up_bf16());
  }
  pending = lora.begin(parts_.plan, layer, {LoraTarget::kDown}, buffers.activation.as<bf16>(), intermediate, hidden,
                       chain());
  linear(buffers.activation.as<bf16>(), n, intermediate, weights.down_proj, hidden, buffers.delta.data(), false, hidden,
         weights.down_fp8);
  parts_.prefetcher.after_down(parts_.model, layer, stream);
  return reduce_delta(lora.end(pending, stream));  // added by the next norm, with the delta buffer
}

const float* LayerRunner::reduce_delta(const float* lora_delta) {
  if (parts_.rank.communicator == nullptr) return lora_delta;
  const StepPlan& plan = parts_.plan.plan();
  const int32_t n = plan.num_rows();
  const int32_t hidden = parts_.layer.hidden_size;
  float* delta = parts_.buffers.delta.as<float>();
  launch_add_lora_rows(delta, lora_delta, plan_pointer<int32_t>(plan.sections().lora_row_of_token), n, hidden,
                       step_.stream);
  parts_.rank.communicator->all_reduce_sum(delta, static_cast<int64_t>(n) * hidden, step_.stream);
  return nullptr;
}

void LayerRunner::attention(int layer) {
  const StepPlan& plan = parts_.plan.plan();
  const PlanSections& sections = plan.sections();
  const ModelConfig& config = parts_.config;
  const LayerSpec& spec = parts_.layer;
  const DeviceKvPools& pools = parts_.pools;
  StepBuffers& buffers = parts_.buffers;
  const bool pingpong = parts_.tuning.pingpong_prefill;
  AttentionParams attention;
  attention.q = buffers.q.as<bf16>();
  attention.k_cache = pools.k_pool(layer);
  attention.v_cache = pools.v_pool(layer);
  attention.k_cache_fp8 = pools.k_pool_fp8(layer);
  attention.v_cache_fp8 = pools.v_pool_fp8(layer);
  attention.k_scale = pools.k_scale(layer);
  attention.v_scale = pools.v_scale(layer);
  attention.block_tables = plan_pointer<int32_t>(sections.block_tables);
  attention.sequences = plan_pointer<AttentionSequence>(sections.sequences);
  attention.out = buffers.attention_out.as<bf16>();
  attention.partial_out = buffers.partial_out.as<float>();
  attention.partial_lse = buffers.partial_lse.as<float>();
  attention.num_heads = spec.num_heads;
  attention.num_kv_heads = spec.num_kv_heads;
  attention.head_dim = spec.head_dim;
  attention.block_size = pools.main_shape().block_size;
  attention.scale = 1.0f / std::sqrt(static_cast<float>(spec.head_dim));
  launch_attention(attention, AttentionVariant::kPrefill, plan_pointer<AttentionWorkItem>(sections.prefill_items),
                   plan.num_prefill_items(), chain());
  launch_attention(attention, pingpong ? AttentionVariant::kPrefillWidePingPong : AttentionVariant::kPrefillWide,
                   plan_pointer<AttentionWorkItem>(sections.wide_prefill_items), plan.num_wide_prefill_items(), chain());
  launch_attention(attention, AttentionVariant::kDecode, plan_pointer<AttentionWorkItem>(sections.decode_items),
                   plan.num_decode_items(), chain());
  if (plan.has_forked_sequences()) {
    const cudaStream_t stream = step_.stream;
    attention.residual_pool = pools.residual_pool(layer);
    attention.residual_block_tables = plan_pointer<int32_t>(sections.residual_block_tables);
    attention.residual_block_size = pools.residual_shape().block_size;
    attention.residual_rank_stride = pools.residual_rank_stride();
    attention.lora_modules = parts_.lora.device_table();
    attention.num_layers = config.num_layers;
    attention.layer = layer;
    attention.inv_freq = parts_.model.inverse_frequencies();
    launch_attention(attention, AttentionVariant::kPrefill,
                     plan_pointer<AttentionWorkItem>(sections.forked_prefill_items), plan.num_forked_prefill_items(),
                     stream, step_.residual_rank);
    launch_attention(attention, AttentionVariant::kDecode, plan_pointer<AttentionWorkItem>(sections.forked_decode_items),
                     plan.num_forked_decode_items(), stream, step_.residual_rank);
    bf16* scratch_k = pools.scratch_k();
    launch_forked_wide_passes(attention, plan.forked_wide_passes().data(), plan.forked_wide_passes().size(),
                              plan_pointer<ResidualRebuildItem>(sections.rebuild_items),
                              plan_pointer<AttentionWorkItem>(sections.forked_wide_items), scratch_k,
                              scratch_k + static_cast<size_t>(plan.num_scratch_keys()) * spec.kv_size(), stream,
                              step_.residual_rank,
                              pingpong ? AttentionVariant::kPrefillWidePingPong : AttentionVariant::kPrefillWide);
  }
  if (!skipped(kSkipCombine))
    launch_attention_combine(attention, plan_pointer<AttentionCombineItem>(sections.combine_items),
                             plan.num_combine_items(), chain());
}

void LayerRunner::capture_hidden_states(int index, const float* lora_delta) {
  const StepPlan& plan = parts_.plan.plan();
  const int32_t num_rows = static_cast<int32_t>(plan.logit_rows().size());
  const PlanSections& sections = plan.sections();
  StepBuffers& buffers = parts_.buffers;
  const int32_t hidden = parts_.config.hidden_size;
  launch_gather_hidden(buffers.residual.as<float>(), index == 0 ? nullptr : buffers.delta.as<float>(), lora_delta,
                       plan_pointer<int32_t>(sections.lora_row_of_token), plan_pointer<int32_t>(sections.logit_rows),
                       num_rows, hidden,
                       buffers.hidden_states.as<float>() + static_cast<int64_t>(index) * num_rows * hidden, chain());
}

}  // namespace loom::cuda
