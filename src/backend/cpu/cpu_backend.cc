#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_backend_impl.h"

#include <cblas.h>
#include <omp.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "backend/batch_checks.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/in_process_group.h"
#include "backend/cpu/lora_apply.h"
#include "backend/cpu/paged_attention.h"
#include "backend/cpu/residual_attention.h"
#include "backend/cpu/quant/quantized_matmul.h"
#include "backend/cpu/tensor_parallel_cpu_backend.h"
#include "backend/rope.h"
#include "formats/gguf_dequant.h"
#include "lora/adapter.h"
#include "model/layer_spec.h"
#include "util/error.h"

namespace loom {

namespace {

const float* optional_data(const Tensor& tensor) { return tensor.empty() ? nullptr : tensor.data; }

// OpenBLAS's DYNAMIC_ARCH picks kernels by CPU model and falls back to SSE3
// ("Prescott") on models newer than the library, which makes every GEMM 2-3x
// slower. The choice is made when the library loads, so all we can do is say so.
void warn_if_openblas_kernels_are_generic() {
  const std::string core = openblas_get_corename();
  const bool is_pre_avx2_core = core == "Prescott" || core == "Core2" || core == "Penryn" ||
                                core == "Dunnington" || core == "Nehalem" || core == "Atom";
  if (is_pre_avx2_core && __builtin_cpu_supports("avx2"))
    spdlog::warn("OpenBLAS uses its generic '{}' kernels on this AVX2 CPU; set OPENBLAS_CORETYPE=Haswell "
                 "(or SkylakeX where AVX-512 is available) in the environment for 2-3x faster GEMMs",
                 core);
}

// Every weight kept quantized must be a matrix of a type the kernels take (norms
// and biases, which the backend reads as fp32, must not be); logs what the
// forward runs on.
void check_quantized_weights(const ModelConfig& config, const ModelWeights& weights) {
  std::map<std::string, int> num_tensors_of_type;
  for (const auto& [name, tensor] : model_weights_to_tensor_map(config, weights)) {
    if (!tensor.is_quantized()) continue;
    if (tensor.shape.size() != 2)
      fail(ErrorKind::kUnsupported, "cpu backend: tensor {} is {}; it must be fp32", name,
           ggml_type_name(tensor.quantized.ggml_type));
    cpu::quant::check_quantized_matmul_type(tensor.quantized.ggml_type, name);
    ++num_tensors_of_type[ggml_type_name(tensor.quantized.ggml_type)];
  }
  if (num_tensors_of_type.empty()) return;
  std::string summary;
  for (const auto& [type, count] : num_tensors_of_type)
    summary += fmt::format("{}{} x{}", summary.empty() ? "" : ", ", type, count);
  spdlog::info("cpu backend: weights kept quantized ({}), {} kernels", summary,
               cpu::quant::simd_level_name(cpu::quant::best_simd_level()));
}

// FP8 checkpoints: the linear weights dequantized to fp32 at load (an emulation
// for tests and references: W8A16 semantics, activations never quantized, the
// static input scales unused). Other weights are returned as they are.
std::shared_ptr<const ModelWeights> dequantize_fp8(std::shared_ptr<const ModelWeights> weights,
                                                   const ModelConfig& config) {
  if (weights == nullptr || !has_fp8_weights(*weights)) return weights;
  spdlog::info("cpu backend: FP8 weights ({}) dequantized to fp32 at load; activations stay fp32 (W8A16)",
               describe(config.quantization));
  return std::make_shared<const ModelWeights>(dequantize_fp8_weights(*weights));
}

cpu::CpuRank with_model_vocab(cpu::CpuRank rank, const ModelConfig& config) {
  if (rank.model_vocab_size == 0) rank.model_vocab_size = config.vocab_size;
  if (rank.shard.size == 1) rank.shard = tensor_parallel_shard(config, 0, 1);
  return rank;
}

}  // namespace

namespace cpu {

CpuBackend::CpuBackend(const ModelConfig& config, std::shared_ptr<const ModelWeights> weights,
                       const CpuBackendConfig& backend_config, const CpuRank& rank)
    : config_(config),
      rank_(with_model_vocab(rank, config)),
      layer_(layer_spec(config)),
      weights_(dequantize_fp8(std::move(weights), config)),
      num_threads_(backend_config.num_threads > 0 ? backend_config.num_threads : omp_get_max_threads()),
      rope_(config),
      pools_(config) {
  if (weights_ == nullptr) fail(ErrorKind::kInvalidArgument, "cpu backend: no weights given");
  if (backend_config.max_adapter_slots < 0)
    fail(ErrorKind::kInvalidArgument, "cpu backend: max_adapter_slots is {}",
         backend_config.max_adapter_slots);
  validate_weights(*weights_, config_);
  check_quantized_weights(config_, *weights_);
  adapters_.resize(backend_config.max_adapter_slots);
  // The GEMMs are split across our OpenMP threads (cpu_kernels.cc); OpenBLAS's own
  // pthread pool would spin next to them and fight for the same cores.
  openblas_set_num_threads(1);
  warn_if_openblas_kernels_are_generic();
}

void CpuBackend::allocate_kv_cache(const KvCacheShape& shape) { pools_.allocate_main(shape); }

void CpuBackend::allocate_residual_cache(const ResidualCacheShape& shape) { pools_.allocate_residual(shape); }

void CpuBackend::set_adapter(int32_t slot, std::shared_ptr<const LoraAdapter> adapter) {
  if (slot < 0 || slot >= max_adapter_slots())
    fail(ErrorKind::kInvalidArgument, "cpu backend: adapter slot {} outside [0, {})", slot,
         max_adapter_slots());
  if (adapter != nullptr) validate_adapter(*adapter, config_);
  adapters_[slot] = std::move(adapter);
}

ForwardResult CpuBackend::forward(const Batch& batch) {
  validate_batch(batch,
                      {rank_.model_vocab_size, pools_.main_shape().num_blocks, pools_.main_shape().block_size, pools_.residual_shape().num_blocks,
                       pools_.residual_shape().block_size, pools_.residual_shape().max_rank, config_.qk_norm},
                      adapters_);
  ForwardResult result;
  result.vocab_size = config_.vocab_size;
  step_.num_tokens = batch.num_tokens();
  if (step_.num_tokens == 0) return result;

  // Applies to this (engine) thread's parallel regions only.
  omp_set_num_threads(num_threads_);
  cpu::place_tokens(batch, pools_.main_shape().block_size, step_.placement, pools_.residual_shape().block_size);
  step_.num_rows = step_.num_tokens + step_.placement.num_decoder_rows();
  group_rows_by_adapter(batch);
  if (config_.sliding_window > 0 && step_.placement.max_context_length > config_.sliding_window &&
      !warned_about_sliding_window_) {
    warned_about_sliding_window_ = true;
    spdlog::warn("cpu backend: context of {} tokens exceeds the sliding window of {}; attending to all",
                 step_.placement.max_context_length, config_.sliding_window);
  }
  prepare_rope_tables(batch);
  if (step_.placement.has_forked_sequences) extend_position_tables(step_.placement.max_forked_context_length);
  embed_rows(batch);
  choose_logit_rows(batch);
  if (batch.capture_hidden_states) {
    result.hidden_states.resize((config_.num_layers + 1) * step_.logit_rows.size() * config_.hidden_size);
    capture_hidden_states(0, result);
  }

  for (int layer = 0; layer < config_.num_layers; ++layer) {
    attention_block(layer, batch);
    // attention_block wrote this layer's K/V (and rCache) for the step: nothing later touches them.
    if (batch.kv_layer_listener != nullptr) {
      KvLayerFence written;  // nothing to wait for on the CPU
      written.rank = rank_.shard.rank;
      batch.kv_layer_listener->layer_written(layer, written);
    }
    mlp_block(layer);
    if (batch.capture_hidden_states) capture_hidden_states(layer + 1, result);
  }
  compute_logits(result);
  return result;
}

void CpuBackend::group_rows_by_adapter(const Batch& batch) {
  kv_lora_is_row_lora_ = step_.placement.num_decoder_rows() == 0 && !step_.placement.has_forked_sequences;
  if (kv_lora_is_row_lora_) {
    lora_.group_tokens(batch.adapter_slots, max_adapter_slots());
    return;
  }
  // Decoder rows take their sequence's adapter on q, o and the MLP; k/v get no
  // LoRA on decoder rows (they write nothing) nor on forked tokens (rCache instead).
  step_.row_adapter_slots.assign(batch.adapter_slots.begin(), batch.adapter_slots.end());
  for (int32_t token : step_.placement.token_of_decoder_row)
    step_.row_adapter_slots.push_back(batch.sequences[step_.placement.sequence_of_token[token]].decoder_adapter_slot);
  lora_.group_tokens(step_.row_adapter_slots, max_adapter_slots());
  step_.kv_adapter_slots.assign(batch.adapter_slots.begin(), batch.adapter_slots.end());
  for (const BatchSequence& sequence : batch.sequences)
    if (sequence.forked_adapter_slot >= 0)
      std::fill_n(step_.kv_adapter_slots.begin() + sequence.token_offset, sequence.num_new_tokens, -1);
  kv_lora_.group_tokens(step_.kv_adapter_slots, max_adapter_slots());
}

void CpuBackend::prepare_rope_tables(const Batch& batch) {
  const int64_t half = config_.head_dim / 2;
  step_.rope_cos.resize(step_.num_rows * half);
  step_.rope_sin.resize(step_.num_rows * half);
  for (int64_t t = 0; t < step_.num_tokens; ++t)
    rope_.cos_sin(batch.positions[t], step_.rope_cos.data() + t * half, step_.rope_sin.data() + t * half);
  for (int64_t row = step_.num_tokens; row < step_.num_rows; ++row) {
    const int64_t token = step_.placement.token_of_decoder_row[row - step_.num_tokens];
    std::copy_n(step_.rope_cos.data() + token * half, half, step_.rope_cos.data() + row * half);
    std::copy_n(step_.rope_sin.data() + token * half, half, step_.rope_sin.data() + row * half);
  }
}

void CpuBackend::extend_position_tables(int32_t num_positions) {
  if (num_positions <= num_table_positions_) return;
  const int64_t half = config_.head_dim / 2;
  position_cos_.resize(num_positions * half);
  position_sin_.resize(num_positions * half);
  for (int64_t position = num_table_positions_; position < num_positions; ++position)
    rope_.cos_sin(position, position_cos_.data() + position * half, position_sin_.data() + position * half);
  num_table_positions_ = num_positions;
}

void CpuBackend::embed_rows(const Batch& batch) {
  const int64_t hidden = config_.hidden_size;
  step_.hidden.resize(step_.num_rows * hidden);
  for (int64_t row = 0; row < step_.num_rows; ++row) {
    const int64_t token = row < step_.num_tokens ? row : step_.placement.token_of_decoder_row[row - step_.num_tokens];
    const Tensor& embedding = weights_->embed_tokens;
    const int64_t id = batch.token_ids[token] - rank_.shard.vocab_begin;
    if (id < 0 || id >= rank_.shard.vocab_slice())  // another rank's row: its all-reduce adds it
      std::fill_n(step_.hidden.data() + row * hidden, hidden, 0.0f);
    else if (embedding.is_quantized())
      dequantize_ggml(static_cast<GgmlType>(embedding.quantized.ggml_type),
                      embedding.quantized.bytes + id * embedding.quantized.row_bytes, hidden,
                      step_.hidden.data() + row * hidden);
    else
      std::memcpy(step_.hidden.data() + row * hidden, embedding.data + id * hidden, hidden * sizeof(float));
  }
  all_reduce(step_.hidden.data(), step_.num_rows * hidden);
}

void CpuBackend::all_reduce(float* data, int64_t count) {
  if (rank_.group != nullptr) rank_.group->all_reduce_sum(rank_.shard.rank, data, count);
}

void CpuBackend::choose_logit_rows(const Batch& batch) {
  step_.logit_tokens.clear();
  step_.logit_rows.clear();
  for (const BatchSequence& sequence : batch.sequences) {
    const int32_t first = sequence.logits_for_all_tokens ? sequence.token_offset
                                                         : sequence.token_offset + sequence.num_new_tokens - 1;
    for (int32_t t = first; t < sequence.token_offset + sequence.num_new_tokens; ++t) {
      step_.logit_tokens.push_back(t);
      step_.logit_rows.push_back(sequence.decoder_adapter_slot >= 0 ? step_.placement.decoder_row_of_token[t] : t);
    }
  }
}

void CpuBackend::capture_hidden_states(int index, ForwardResult& result) const {
  const int64_t hidden = config_.hidden_size;
  float* destination = result.hidden_states.data() + index * step_.logit_rows.size() * hidden;
  for (size_t r = 0; r < step_.logit_rows.size(); ++r)
    std::memcpy(destination + r * hidden, step_.hidden.data() + step_.logit_rows[r] * hidden, hidden * sizeof(float));
}

void CpuBackend::apply_lora(LoraTarget target, int layer, const float* x, int64_t in_features, float* y,
                            int64_t out_features) {
  const bool is_kv = target == LoraTarget::kK || target == LoraTarget::kV;
  cpu::LoraApplier& lora = is_kv && !kv_lora_is_row_lora_ ? kv_lora_ : lora_;
  if (lora.has_groups()) lora.apply(target, layer, x, in_features, y, out_features, adapters_);
}

void CpuBackend::attention_block(int layer, const Batch& batch) {
  const LayerWeights& weights = weights_->layers[layer];
  const int64_t n = step_.num_rows;  // k/v rows past step_.num_tokens (decoder rows) are computed, never used
  const int64_t num_tokens = step_.num_tokens;
  const int64_t hidden = layer_.hidden_size;
  const int64_t q_size = layer_.q_size();
  const int64_t kv_size = layer_.kv_size();
  const int head_dim = layer_.head_dim;

  step_.normed.resize(n * hidden);
  step_.q.resize(n * q_size);
  step_.k.resize(n * kv_size);
  step_.v.resize(n * kv_size);
  step_.attention_out.resize(n * q_size);
  step_.projected.resize(n * hidden);

  cpu::rms_norm_rows(step_.hidden.data(), n, hidden, weights.input_norm.data, layer_.rms_norm_eps,
                     step_.normed.data());
  const float* q_bias = layer_.qkv_bias ? optional_data(weights.q_bias) : nullptr;
  const float* k_bias = layer_.qkv_bias ? optional_data(weights.k_bias) : nullptr;
  const float* v_bias = layer_.qkv_bias ? optional_data(weights.v_bias) : nullptr;
  const cpu::GemmOutput qkv[] = {cpu::weight_output(weights.q_proj, step_.q.data(), q_size, q_bias),
                                 cpu::weight_output(weights.k_proj, step_.k.data(), kv_size, k_bias),
                                 cpu::weight_output(weights.v_proj, step_.v.data(), kv_size, v_bias)};
  cpu::gemm(step_.normed.data(), hidden, n, hidden, qkv, 1.0f, 0.0f);
  apply_lora(LoraTarget::kQ, layer, step_.normed.data(), hidden, step_.q.data(), q_size);
  apply_lora(LoraTarget::kK, layer, step_.normed.data(), hidden, step_.k.data(), kv_size);
  apply_lora(LoraTarget::kV, layer, step_.normed.data(), hidden, step_.v.data(), kv_size);

  if (layer_.qk_norm) {
    cpu::rms_norm_rows(step_.q.data(), n * layer_.num_heads, head_dim, weights.q_norm.data,
                       layer_.rms_norm_eps, step_.q.data());
    cpu::rms_norm_rows(step_.k.data(), num_tokens * layer_.num_kv_heads, head_dim, weights.k_norm.data,
                       layer_.rms_norm_eps, step_.k.data());
  }
  const int64_t half = head_dim / 2;
#pragma omp parallel for if (n * (q_size + kv_size) >= 64 * 1024)
  for (int64_t t = 0; t < n; ++t) {
    rope_.rotate(step_.q.data() + t * q_size, layer_.num_heads, step_.rope_cos.data() + t * half,
                 step_.rope_sin.data() + t * half);
    if (t < num_tokens)
      rope_.rotate(step_.k.data() + t * kv_size, layer_.num_kv_heads, step_.rope_cos.data() + t * half,
                   step_.rope_sin.data() + t * half);
  }

  cpu::write_kv(step_.k.data(), step_.v.data(), step_.placement, kv_size, pools_.k_pool(layer), pools_.v_pool(layer));
  const cpu::AttentionShape shape{layer_.num_heads, layer_.num_kv_heads, head_dim, pools_.main_shape().block_size};
  cpu::ForkedAttention forked;
  if (step_.placement.has_forked_sequences) {
    cpu::write_residuals(step_.normed.data(), hidden, batch, step_.placement, layer, adapters_, pools_.residual_shape().max_rank,
                         pools_.residual_pool(layer), step_.residual_scratch);
    forked = {pools_.residual_pool(layer), pools_.residual_shape().block_size, pools_.residual_shape().max_rank, layer,
              &adapters_, &rope_, position_cos_.data(), position_sin_.data()};
  }
  cpu::paged_attention(step_.q.data(), batch, step_.placement, shape, pools_.k_pool(layer), pools_.v_pool(layer),
                       num_threads_, step_.attention_scratch, step_.attention_out.data(),
                       step_.placement.has_forked_sequences ? &forked : nullptr);

  const float* o_bias = layer_.o_bias ? optional_data(weights.o_bias) : nullptr;
  cpu::linear(step_.attention_out.data(), n, q_size, weights.o_proj, o_bias, hidden, step_.projected.data());
  apply_lora(LoraTarget::kO, layer, step_.attention_out.data(), q_size, step_.projected.data(), hidden);
  all_reduce(step_.projected.data(), n * hidden);
  cpu::add_in_place(step_.hidden.data(), step_.projected.data(), n * hidden);
}

void CpuBackend::mlp_block(int layer) {
  const LayerWeights& weights = weights_->layers[layer];
  const int64_t n = step_.num_rows;
  const int64_t hidden = layer_.hidden_size;
  const int64_t intermediate = layer_.intermediate_size;
  step_.gate.resize(n * intermediate);
  step_.up.resize(n * intermediate);

  cpu::rms_norm_rows(step_.hidden.data(), n, hidden, weights.post_attention_norm.data, layer_.rms_norm_eps,
                     step_.normed.data());
  const cpu::GemmOutput gate_up[] = {cpu::weight_output(weights.gate_proj, step_.gate.data(), intermediate),
                                     cpu::weight_output(weights.up_proj, step_.up.data(), intermediate)};
  cpu::gemm(step_.normed.data(), hidden, n, hidden, gate_up, 1.0f, 0.0f);
  apply_lora(LoraTarget::kGate, layer, step_.normed.data(), hidden, step_.gate.data(), intermediate);
  apply_lora(LoraTarget::kUp, layer, step_.normed.data(), hidden, step_.up.data(), intermediate);
  cpu::silu_multiply(step_.gate.data(), step_.up.data(), n * intermediate);
  cpu::linear(step_.gate.data(), n, intermediate, weights.down_proj, nullptr, hidden, step_.projected.data());
  apply_lora(LoraTarget::kDown, layer, step_.gate.data(), intermediate, step_.projected.data(), hidden);
  all_reduce(step_.projected.data(), n * hidden);
  cpu::add_in_place(step_.hidden.data(), step_.projected.data(), n * hidden);
}

void CpuBackend::compute_logits(ForwardResult& result) {
  const int64_t num_rows = static_cast<int64_t>(step_.logit_rows.size());
  const int64_t hidden = config_.hidden_size;
  for (int64_t r = 0; r < num_rows; ++r)
    std::memcpy(step_.normed.data() + r * hidden, step_.hidden.data() + step_.logit_rows[r] * hidden, hidden * sizeof(float));
  cpu::rms_norm_rows(step_.normed.data(), num_rows, hidden, weights_->final_norm.data, config_.rms_norm_eps,
                     step_.normed.data());
  result.logits.resize(num_rows * config_.vocab_size);
  cpu::linear(step_.normed.data(), num_rows, hidden, weights_->lm_head, nullptr, config_.vocab_size,
              result.logits.data());
  result.logit_token_index.assign(step_.logit_tokens.begin(), step_.logit_tokens.end());
}

}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend(const ModelConfig& config,
                                          std::shared_ptr<const ModelWeights> weights,
                                          const CpuBackendConfig& backend_config) {
  if (backend_config.tensor_parallel_size > 1)  // shards cut from the dequantized weights
    return cpu::TensorParallelCpuBackend::make(config, dequantize_fp8(std::move(weights), config), backend_config);
  return std::make_unique<cpu::CpuBackend>(config, std::move(weights), backend_config);
}

}  // namespace loom
