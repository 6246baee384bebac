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
#include "backend/cpu/host_kv_pool.h"
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
      weights_(std::move(weights)),
      num_threads_(backend_config.num_threads > 0 ? backend_config.num_threads : omp_get_max_threads()),
      rope_(config) {
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

void CpuBackend::allocate_kv_cache(const KvCacheShape& shape) {
  if (shape.num_blocks <= 0 || shape.block_size <= 0)
    fail(ErrorKind::kInvalidArgument, "cpu backend: KV cache of {} blocks of {} tokens", shape.num_blocks,
         shape.block_size);
  const int64_t floats_per_pool =
      static_cast<int64_t>(shape.num_blocks) * shape.block_size * config_.kv_size();
  k_pools_.clear();
  v_pools_.clear();
  kv_shape_ = {0, 0};
  try {
    k_pools_.resize(config_.num_layers);
    v_pools_.resize(config_.num_layers);
    for (int layer = 0; layer < config_.num_layers; ++layer) {
      k_pools_[layer].assign(floats_per_pool, 0.0f);
      v_pools_[layer].assign(floats_per_pool, 0.0f);
    }
  } catch (const std::bad_alloc&) {
    k_pools_.clear();
    v_pools_.clear();
    fail(ErrorKind::kCapacity, "cpu backend: cannot allocate a KV cache of {} bytes",
         floats_per_pool * 2 * config_.num_layers * static_cast<int64_t>(sizeof(float)));
  }
  kv_shape_ = shape;
}

void CpuBackend::allocate_residual_cache(const ResidualCacheShape& shape) {
  if (shape.num_blocks <= 0 || shape.block_size <= 0 || shape.max_rank <= 0)
    fail(ErrorKind::kInvalidArgument, "cpu backend: residual cache of {} blocks of {} tokens, max rank {}",
         shape.num_blocks, shape.block_size, shape.max_rank);
  const int64_t floats_per_pool = static_cast<int64_t>(shape.num_blocks) * shape.block_size * 2 * shape.max_rank;
  residual_pools_.clear();
  residual_shape_ = {0, 0, 0};
  try {
    residual_pools_.resize(config_.num_layers);
    for (auto& pool : residual_pools_) pool.assign(floats_per_pool, 0.0f);
  } catch (const std::bad_alloc&) {
    residual_pools_.clear();
    fail(ErrorKind::kCapacity, "cpu backend: cannot allocate a residual cache of {} bytes",
         floats_per_pool * config_.num_layers * static_cast<int64_t>(sizeof(float)));
  }
  residual_shape_ = shape;
}

std::vector<float*> CpuBackend::device_arrays(KvPoolKind pool) {
  std::vector<float*> arrays;
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    if (pool == KvPoolKind::kMain) {
      if (layer < static_cast<int>(k_pools_.size())) {
        arrays.push_back(k_pools_[layer].data());
        arrays.push_back(v_pools_[layer].data());
      }
    } else if (layer < static_cast<int>(residual_pools_.size())) {
      arrays.push_back(residual_pools_[layer].data());
    }
  }
  return arrays;
}

int64_t CpuBackend::device_floats_per_block(KvPoolKind pool) const {
  if (pool == KvPoolKind::kMain) return static_cast<int64_t>(kv_shape_.block_size) * config_.kv_size();
  return static_cast<int64_t>(residual_shape_.block_size) * 2 * residual_shape_.max_rank;
}

void CpuBackend::allocate_host_kv_cache(KvPoolKind pool, int32_t num_blocks) {
  const bool is_main = pool == KvPoolKind::kMain;
  cpu::HostKvPool& host = is_main ? host_main_pool_ : host_residual_pool_;
  host.allocate(num_blocks, num_device_blocks(pool), is_main ? 2 * config_.num_layers : config_.num_layers,
                device_floats_per_block(pool), is_main ? "host KV pool" : "host residual pool");
}

void CpuBackend::copy_kv_blocks(KvPoolKind pool, KvCopyDirection direction, std::span<const int32_t> device_block_ids,
                                std::span<const int32_t> host_block_ids) {
  const cpu::HostKvPool& host = host_pool(pool);
  host.check_copyable(device_floats_per_block(pool), device_block_ids.size());
  // A local list, not backend scratch: this runs beside forward().
  host.copy(direction, device_arrays(pool), num_device_blocks(pool), device_block_ids, host_block_ids);
}

void CpuBackend::set_adapter(int32_t slot, std::shared_ptr<const LoraAdapter> adapter) {
  if (slot < 0 || slot >= max_adapter_slots())
    fail(ErrorKind::kInvalidArgument, "cpu backend: adapter slot {} outside [0, {})", slot,
         max_adapter_slots());
  if (adapter != nullptr) validate_adapter(*adapter, config_);
  adapters_[slot] = std::move(adapter);
}

ForwardResult CpuBackend::forward(const Batch& batch) {
  validate_batch(batch,
                      {rank_.model_vocab_size, kv_shape_.num_blocks, kv_shape_.block_size, residual_shape_.num_blocks,
                       residual_shape_.block_size, residual_shape_.max_rank, config_.qk_norm},
                      adapters_);
  ForwardResult result;
  result.vocab_size = config_.vocab_size;
  num_tokens_ = batch.num_tokens();
  if (num_tokens_ == 0) return result;

  // Applies to this (engine) thread's parallel regions only.
  omp_set_num_threads(num_threads_);
  cpu::place_tokens(batch, kv_shape_.block_size, placement_, residual_shape_.block_size);
  num_rows_ = num_tokens_ + placement_.num_decoder_rows();
  group_rows_by_adapter(batch);
  if (config_.sliding_window > 0 && placement_.max_context_length > config_.sliding_window &&
      !warned_about_sliding_window_) {
    warned_about_sliding_window_ = true;
    spdlog::warn("cpu backend: context of {} tokens exceeds the sliding window of {}; attending to all",
                 placement_.max_context_length, config_.sliding_window);
  }
  prepare_rope_tables(batch);
  if (placement_.has_forked_sequences) extend_position_tables(placement_.max_forked_context_length);
  embed_rows(batch);
  choose_logit_rows(batch);
  if (batch.capture_hidden_states) {
    result.hidden_states.resize((config_.num_layers + 1) * logit_rows_.size() * config_.hidden_size);
    capture_hidden_states(0, result);
  }

  for (int layer = 0; layer < config_.num_layers; ++layer) {
    attention_block(layer, batch);
    mlp_block(layer);
    if (batch.capture_hidden_states) capture_hidden_states(layer + 1, result);
  }
  compute_logits(result);
  return result;
}

void CpuBackend::group_rows_by_adapter(const Batch& batch) {
  kv_lora_is_row_lora_ = placement_.num_decoder_rows() == 0 && !placement_.has_forked_sequences;
  if (kv_lora_is_row_lora_) {
    lora_.group_tokens(batch.adapter_slots, max_adapter_slots());
    return;
  }
  // Decoder rows take their sequence's adapter on q, o and the MLP; k/v get no
  // LoRA on decoder rows (they write nothing) nor on forked tokens (rCache instead).
  row_adapter_slots_.assign(batch.adapter_slots.begin(), batch.adapter_slots.end());
  for (int32_t token : placement_.token_of_decoder_row)
    row_adapter_slots_.push_back(batch.sequences[placement_.sequence_of_token[token]].decoder_adapter_slot);
  lora_.group_tokens(row_adapter_slots_, max_adapter_slots());
  kv_adapter_slots_.assign(batch.adapter_slots.begin(), batch.adapter_slots.end());
  for (const BatchSequence& sequence : batch.sequences)
    if (sequence.forked_adapter_slot >= 0)
      std::fill_n(kv_adapter_slots_.begin() + sequence.token_offset, sequence.num_new_tokens, -1);
  kv_lora_.group_tokens(kv_adapter_slots_, max_adapter_slots());
}

void CpuBackend::prepare_rope_tables(const Batch& batch) {
  const int64_t half = config_.head_dim / 2;
  rope_cos_.resize(num_rows_ * half);
  rope_sin_.resize(num_rows_ * half);
  for (int64_t t = 0; t < num_tokens_; ++t)
    rope_.cos_sin(batch.positions[t], rope_cos_.data() + t * half, rope_sin_.data() + t * half);
  for (int64_t row = num_tokens_; row < num_rows_; ++row) {
    const int64_t token = placement_.token_of_decoder_row[row - num_tokens_];
    std::copy_n(rope_cos_.data() + token * half, half, rope_cos_.data() + row * half);
    std::copy_n(rope_sin_.data() + token * half, half, rope_sin_.data() + row * half);
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
  hidden_.resize(num_rows_ * hidden);
  for (int64_t row = 0; row < num_rows_; ++row) {
    const int64_t token = row < num_tokens_ ? row : placement_.token_of_decoder_row[row - num_tokens_];
    const Tensor& embedding = weights_->embed_tokens;
    const int64_t id = batch.token_ids[token] - rank_.shard.vocab_begin;
    if (id < 0 || id >= rank_.shard.vocab_slice())  // another rank's row: its all-reduce adds it
      std::fill_n(hidden_.data() + row * hidden, hidden, 0.0f);
    else if (embedding.is_quantized())
      dequantize_ggml(static_cast<GgmlType>(embedding.quantized.ggml_type),
                      embedding.quantized.bytes + id * embedding.quantized.row_bytes, hidden,
                      hidden_.data() + row * hidden);
    else
      std::memcpy(hidden_.data() + row * hidden, embedding.data + id * hidden, hidden * sizeof(float));
  }
  all_reduce(hidden_.data(), num_rows_ * hidden);
}

void CpuBackend::all_reduce(float* data, int64_t count) {
  if (rank_.group != nullptr) rank_.group->all_reduce_sum(rank_.shard.rank, data, count);
}

void CpuBackend::choose_logit_rows(const Batch& batch) {
  logit_tokens_.clear();
  logit_rows_.clear();
  for (const BatchSequence& sequence : batch.sequences) {
    const int32_t first = sequence.logits_for_all_tokens ? sequence.token_offset
                                                         : sequence.token_offset + sequence.num_new_tokens - 1;
    for (int32_t t = first; t < sequence.token_offset + sequence.num_new_tokens; ++t) {
      logit_tokens_.push_back(t);
      logit_rows_.push_back(sequence.decoder_adapter_slot >= 0 ? placement_.decoder_row_of_token[t] : t);
    }
  }
}

void CpuBackend::capture_hidden_states(int index, ForwardResult& result) const {
  const int64_t hidden = config_.hidden_size;
  float* destination = result.hidden_states.data() + index * logit_rows_.size() * hidden;
  for (size_t r = 0; r < logit_rows_.size(); ++r)
    std::memcpy(destination + r * hidden, hidden_.data() + logit_rows_[r] * hidden, hidden * sizeof(float));
}

void CpuBackend::apply_lora(LoraTarget target, int layer, const float* x, int64_t in_features, float* y,
                            int64_t out_features) {
  const bool is_kv = target == LoraTarget::kK || target == LoraTarget::kV;
  cpu::LoraApplier& lora = is_kv && !kv_lora_is_row_lora_ ? kv_lora_ : lora_;
  if (lora.has_groups()) lora.apply(target, layer, x, in_features, y, out_features, adapters_);
}

void CpuBackend::attention_block(int layer, const Batch& batch) {
  const LayerWeights& weights = weights_->layers[layer];
  const int64_t n = num_rows_;  // k/v rows past num_tokens_ (decoder rows) are computed, never used
  const int64_t num_tokens = num_tokens_;
  const int64_t hidden = layer_.hidden_size;
  const int64_t q_size = layer_.q_size();
  const int64_t kv_size = layer_.kv_size();
  const int head_dim = layer_.head_dim;

  normed_.resize(n * hidden);
  q_.resize(n * q_size);
  k_.resize(n * kv_size);
  v_.resize(n * kv_size);
  attention_out_.resize(n * q_size);
  projected_.resize(n * hidden);

  cpu::rms_norm_rows(hidden_.data(), n, hidden, weights.input_norm.data, layer_.rms_norm_eps,
                     normed_.data());
  const float* q_bias = layer_.qkv_bias ? optional_data(weights.q_bias) : nullptr;
  const float* k_bias = layer_.qkv_bias ? optional_data(weights.k_bias) : nullptr;
  const float* v_bias = layer_.qkv_bias ? optional_data(weights.v_bias) : nullptr;
  const cpu::GemmOutput qkv[] = {cpu::weight_output(weights.q_proj, q_.data(), q_size, q_bias),
                                 cpu::weight_output(weights.k_proj, k_.data(), kv_size, k_bias),
                                 cpu::weight_output(weights.v_proj, v_.data(), kv_size, v_bias)};
  cpu::gemm(normed_.data(), hidden, n, hidden, qkv, 1.0f, 0.0f);
  apply_lora(LoraTarget::kQ, layer, normed_.data(), hidden, q_.data(), q_size);
  apply_lora(LoraTarget::kK, layer, normed_.data(), hidden, k_.data(), kv_size);
  apply_lora(LoraTarget::kV, layer, normed_.data(), hidden, v_.data(), kv_size);

  if (layer_.qk_norm) {
    cpu::rms_norm_rows(q_.data(), n * layer_.num_heads, head_dim, weights.q_norm.data,
                       layer_.rms_norm_eps, q_.data());
    cpu::rms_norm_rows(k_.data(), num_tokens * layer_.num_kv_heads, head_dim, weights.k_norm.data,
                       layer_.rms_norm_eps, k_.data());
  }
  const int64_t half = head_dim / 2;
#pragma omp parallel for if (n * (q_size + kv_size) >= 64 * 1024)
  for (int64_t t = 0; t < n; ++t) {
    rope_.rotate(q_.data() + t * q_size, layer_.num_heads, rope_cos_.data() + t * half,
                 rope_sin_.data() + t * half);
    if (t < num_tokens)
      rope_.rotate(k_.data() + t * kv_size, layer_.num_kv_heads, rope_cos_.data() + t * half,
                   rope_sin_.data() + t * half);
  }

  cpu::write_kv(k_.data(), v_.data(), placement_, kv_size, k_pools_[layer].data(), v_pools_[layer].data());
  const cpu::AttentionShape shape{layer_.num_heads, layer_.num_kv_heads, head_dim, kv_shape_.block_size};
  cpu::ForkedAttention forked;
  if (placement_.has_forked_sequences) {
    cpu::write_residuals(normed_.data(), hidden, batch, placement_, layer, adapters_, residual_shape_.max_rank,
                         residual_pools_[layer].data(), residual_scratch_);
    forked = {residual_pools_[layer].data(), residual_shape_.block_size, residual_shape_.max_rank, layer,
              &adapters_, &rope_, position_cos_.data(), position_sin_.data()};
  }
  cpu::paged_attention(q_.data(), batch, placement_, shape, k_pools_[layer].data(), v_pools_[layer].data(),
                       num_threads_, attention_scratch_, attention_out_.data(),
                       placement_.has_forked_sequences ? &forked : nullptr);

  const float* o_bias = layer_.o_bias ? optional_data(weights.o_bias) : nullptr;
  cpu::linear(attention_out_.data(), n, q_size, weights.o_proj, o_bias, hidden, projected_.data());
  apply_lora(LoraTarget::kO, layer, attention_out_.data(), q_size, projected_.data(), hidden);
  all_reduce(projected_.data(), n * hidden);
  cpu::add_in_place(hidden_.data(), projected_.data(), n * hidden);
}

void CpuBackend::mlp_block(int layer) {
  const LayerWeights& weights = weights_->layers[layer];
  const int64_t n = num_rows_;
  const int64_t hidden = layer_.hidden_size;
  const int64_t intermediate = layer_.intermediate_size;
  gate_.resize(n * intermediate);
  up_.resize(n * intermediate);

  cpu::rms_norm_rows(hidden_.data(), n, hidden, weights.post_attention_norm.data, layer_.rms_norm_eps,
                     normed_.data());
  const cpu::GemmOutput gate_up[] = {cpu::weight_output(weights.gate_proj, gate_.data(), intermediate),
                                     cpu::weight_output(weights.up_proj, up_.data(), intermediate)};
  cpu::gemm(normed_.data(), hidden, n, hidden, gate_up, 1.0f, 0.0f);
  apply_lora(LoraTarget::kGate, layer, normed_.data(), hidden, gate_.data(), intermediate);
  apply_lora(LoraTarget::kUp, layer, normed_.data(), hidden, up_.data(), intermediate);
  cpu::silu_multiply(gate_.data(), up_.data(), n * intermediate);
  cpu::linear(gate_.data(), n, intermediate, weights.down_proj, nullptr, hidden, projected_.data());
  apply_lora(LoraTarget::kDown, layer, gate_.data(), intermediate, projected_.data(), hidden);
  all_reduce(projected_.data(), n * hidden);
  cpu::add_in_place(hidden_.data(), projected_.data(), n * hidden);
}

void CpuBackend::compute_logits(ForwardResult& result) {
  const int64_t num_rows = static_cast<int64_t>(logit_rows_.size());
  const int64_t hidden = config_.hidden_size;
  for (int64_t r = 0; r < num_rows; ++r)
    std::memcpy(normed_.data() + r * hidden, hidden_.data() + logit_rows_[r] * hidden, hidden * sizeof(float));
  cpu::rms_norm_rows(normed_.data(), num_rows, hidden, weights_->final_norm.data, config_.rms_norm_eps,
                     normed_.data());
  result.logits.resize(num_rows * config_.vocab_size);
  cpu::linear(normed_.data(), num_rows, hidden, weights_->lm_head, nullptr, config_.vocab_size,
              result.logits.data());
  result.logit_token_index.assign(logit_tokens_.begin(), logit_tokens_.end());
}

}  // namespace cpu

std::unique_ptr<Backend> make_cpu_backend(const ModelConfig& config,
                                          std::shared_ptr<const ModelWeights> weights,
                                          const CpuBackendConfig& backend_config) {
  if (backend_config.tensor_parallel_size > 1)
    return cpu::TensorParallelCpuBackend::make(config, std::move(weights), backend_config);
  return std::make_unique<cpu::CpuBackend>(config, std::move(weights), backend_config);
}

}  // namespace loom
