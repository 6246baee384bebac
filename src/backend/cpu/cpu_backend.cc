#include "backend/cpu/cpu_backend.h"

#include <cblas.h>
#include <omp.h>

#include <cstring>
#include <string>

#include <spdlog/spdlog.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/input_checks.h"
#include "backend/cpu/lora_apply.h"
#include "backend/cpu/paged_attention.h"
#include "backend/cpu/rope.h"
#include "lora/adapter.h"
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

class CpuBackend final : public Backend {
 public:
  CpuBackend(const ModelConfig& config, std::shared_ptr<const ModelWeights> weights,
             const CpuBackendConfig& backend_config);

  void allocate_kv_cache(const KvCacheShape& shape) override;
  KvCacheShape kv_cache_shape() const override { return kv_shape_; }
  int64_t kv_bytes_per_token() const override {
    return static_cast<int64_t>(config_.num_layers) * 2 * config_.kv_size() * sizeof(float);
  }
  void set_adapter(int32_t slot, std::shared_ptr<const LoraAdapter> adapter) override;
  int32_t max_adapter_slots() const override { return static_cast<int32_t>(adapters_.size()); }
  ForwardResult forward(const Batch& batch) override;

 private:
  void prepare_rope_tables(const Batch& batch);
  void attention_block(int layer, const Batch& batch);
  void mlp_block(int layer);
  void apply_lora(LoraTarget target, int layer, const float* x, int64_t in_features, float* y,
                  int64_t out_features);
  void compute_logits(const Batch& batch, ForwardResult& result);

  const ModelConfig config_;
  const std::shared_ptr<const ModelWeights> weights_;
  const int num_threads_;
  const cpu::Rope rope_;

  KvCacheShape kv_shape_{0, 0};
  std::vector<std::vector<float>> k_pools_;  // [layer][num_blocks * block_size * kv_size]
  std::vector<std::vector<float>> v_pools_;
  std::vector<std::shared_ptr<const LoraAdapter>> adapters_;  // [slot], nullptr = free
  bool warned_about_sliding_window_ = false;

  // Per-forward scratch, grown on demand and kept to avoid allocations per step.
  int64_t num_tokens_ = 0;
  cpu::LoraApplier lora_;
  cpu::TokenPlacement placement_;
  std::vector<float> hidden_;          // [tokens, hidden] residual stream
  std::vector<float> normed_;          // [tokens, hidden]
  std::vector<float> q_, k_, v_;       // [tokens, q_size], [tokens, kv_size] x2
  std::vector<float> attention_out_;   // [tokens, q_size]
  std::vector<float> projected_;       // [tokens, hidden] o_proj / down_proj output
  std::vector<float> gate_, up_;       // [tokens, intermediate]
  std::vector<float> rope_cos_, rope_sin_;  // [tokens, head_dim / 2]
  std::vector<float> attention_scratch_;
  std::vector<int32_t> logit_tokens_;
};

CpuBackend::CpuBackend(const ModelConfig& config, std::shared_ptr<const ModelWeights> weights,
                       const CpuBackendConfig& backend_config)
    : config_(config),
      weights_(std::move(weights)),
      num_threads_(backend_config.num_threads > 0 ? backend_config.num_threads : omp_get_max_threads()),
      rope_(config) {
  if (weights_ == nullptr) fail(ErrorKind::kInvalidArgument, "cpu backend: no weights given");
  if (backend_config.max_adapter_slots < 0)
    fail(ErrorKind::kInvalidArgument, "cpu backend: max_adapter_slots is {}",
         backend_config.max_adapter_slots);
  cpu::validate_weights(*weights_, config_);
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

void CpuBackend::set_adapter(int32_t slot, std::shared_ptr<const LoraAdapter> adapter) {
  if (slot < 0 || slot >= max_adapter_slots())
    fail(ErrorKind::kInvalidArgument, "cpu backend: adapter slot {} outside [0, {})", slot,
         max_adapter_slots());
  if (adapter != nullptr) cpu::validate_adapter(*adapter, config_);
  adapters_[slot] = std::move(adapter);
}

ForwardResult CpuBackend::forward(const Batch& batch) {
  cpu::validate_batch(batch, {config_.vocab_size, kv_shape_.num_blocks, kv_shape_.block_size}, adapters_);
  ForwardResult result;
  result.vocab_size = config_.vocab_size;
  num_tokens_ = batch.num_tokens();
  if (num_tokens_ == 0) return result;

  // Applies to this (engine) thread's parallel regions only.
  omp_set_num_threads(num_threads_);
  lora_.group_tokens(batch.adapter_slots, max_adapter_slots());
  cpu::place_tokens(batch, kv_shape_.block_size, placement_);
  if (config_.sliding_window > 0 && placement_.max_context_length > config_.sliding_window &&
      !warned_about_sliding_window_) {
    warned_about_sliding_window_ = true;
    spdlog::warn("cpu backend: context of {} tokens exceeds the sliding window of {}; attending to all",
                 placement_.max_context_length, config_.sliding_window);
  }
  prepare_rope_tables(batch);

  const int64_t hidden = config_.hidden_size;
  hidden_.resize(num_tokens_ * hidden);
  for (int64_t t = 0; t < num_tokens_; ++t)
    std::memcpy(hidden_.data() + t * hidden, weights_->embed_tokens.data + batch.token_ids[t] * hidden,
                hidden * sizeof(float));

  for (int layer = 0; layer < config_.num_layers; ++layer) {
    attention_block(layer, batch);
    mlp_block(layer);
  }
  compute_logits(batch, result);
  return result;
}

void CpuBackend::prepare_rope_tables(const Batch& batch) {
  const int64_t half = config_.head_dim / 2;
  rope_cos_.resize(num_tokens_ * half);
  rope_sin_.resize(num_tokens_ * half);
  for (int64_t t = 0; t < num_tokens_; ++t)
    rope_.cos_sin(batch.positions[t], rope_cos_.data() + t * half, rope_sin_.data() + t * half);
}

void CpuBackend::apply_lora(LoraTarget target, int layer, const float* x, int64_t in_features, float* y,
                            int64_t out_features) {
  if (lora_.has_groups()) lora_.apply(target, layer, x, in_features, y, out_features, adapters_);
}

void CpuBackend::attention_block(int layer, const Batch& batch) {
  const LayerWeights& weights = weights_->layers[layer];
  const int64_t n = num_tokens_;
  const int64_t hidden = config_.hidden_size;
  const int64_t q_size = config_.q_size();
  const int64_t kv_size = config_.kv_size();
  const int head_dim = config_.head_dim;

  normed_.resize(n * hidden);
  q_.resize(n * q_size);
  k_.resize(n * kv_size);
  v_.resize(n * kv_size);
  attention_out_.resize(n * q_size);
  projected_.resize(n * hidden);

  cpu::rms_norm_rows(hidden_.data(), n, hidden, weights.input_norm.data, config_.rms_norm_eps,
                     normed_.data());
  const float* q_bias = config_.qkv_bias ? optional_data(weights.q_bias) : nullptr;
  const float* k_bias = config_.qkv_bias ? optional_data(weights.k_bias) : nullptr;
  const float* v_bias = config_.qkv_bias ? optional_data(weights.v_bias) : nullptr;
  const cpu::GemmOutput qkv[] = {{weights.q_proj.data, q_size, q_.data(), q_size, q_bias},
                                 {weights.k_proj.data, kv_size, k_.data(), kv_size, k_bias},
                                 {weights.v_proj.data, kv_size, v_.data(), kv_size, v_bias}};
  cpu::gemm(normed_.data(), hidden, n, hidden, qkv, 1.0f, 0.0f);
  apply_lora(LoraTarget::kQ, layer, normed_.data(), hidden, q_.data(), q_size);
  apply_lora(LoraTarget::kK, layer, normed_.data(), hidden, k_.data(), kv_size);
  apply_lora(LoraTarget::kV, layer, normed_.data(), hidden, v_.data(), kv_size);

  if (config_.qk_norm) {
    cpu::rms_norm_rows(q_.data(), n * config_.num_heads, head_dim, weights.q_norm.data,
                       config_.rms_norm_eps, q_.data());
    cpu::rms_norm_rows(k_.data(), n * config_.num_kv_heads, head_dim, weights.k_norm.data,
                       config_.rms_norm_eps, k_.data());
  }
  const int64_t half = head_dim / 2;
#pragma omp parallel for if (n * (q_size + kv_size) >= 64 * 1024)
  for (int64_t t = 0; t < n; ++t) {
    rope_.rotate(q_.data() + t * q_size, config_.num_heads, rope_cos_.data() + t * half,
                 rope_sin_.data() + t * half);
    rope_.rotate(k_.data() + t * kv_size, config_.num_kv_heads, rope_cos_.data() + t * half,
                 rope_sin_.data() + t * half);
  }

  cpu::write_kv(k_.data(), v_.data(), placement_, kv_size, k_pools_[layer].data(), v_pools_[layer].data());
  const cpu::AttentionShape shape{config_.num_heads, config_.num_kv_heads, head_dim, kv_shape_.block_size};
  cpu::paged_attention(q_.data(), batch, placement_, shape, k_pools_[layer].data(),
                       v_pools_[layer].data(), num_threads_, attention_scratch_, attention_out_.data());

  const float* o_bias = config_.o_bias ? optional_data(weights.o_bias) : nullptr;
  cpu::linear(attention_out_.data(), n, q_size, weights.o_proj.data, o_bias, hidden, projected_.data());
  apply_lora(LoraTarget::kO, layer, attention_out_.data(), q_size, projected_.data(), hidden);
  cpu::add_in_place(hidden_.data(), projected_.data(), n * hidden);
}

void CpuBackend::mlp_block(int layer) {
  const LayerWeights& weights = weights_->layers[layer];
  const int64_t n = num_tokens_;
  const int64_t hidden = config_.hidden_size;
  const int64_t intermediate = config_.intermediate_size;
  gate_.resize(n * intermediate);
  up_.resize(n * intermediate);

  cpu::rms_norm_rows(hidden_.data(), n, hidden, weights.post_attention_norm.data, config_.rms_norm_eps,
                     normed_.data());
  const cpu::GemmOutput gate_up[] = {{weights.gate_proj.data, intermediate, gate_.data(), intermediate},
                                     {weights.up_proj.data, intermediate, up_.data(), intermediate}};
  cpu::gemm(normed_.data(), hidden, n, hidden, gate_up, 1.0f, 0.0f);
  apply_lora(LoraTarget::kGate, layer, normed_.data(), hidden, gate_.data(), intermediate);
  apply_lora(LoraTarget::kUp, layer, normed_.data(), hidden, up_.data(), intermediate);
  cpu::silu_multiply(gate_.data(), up_.data(), n * intermediate);
  cpu::linear(gate_.data(), n, intermediate, weights.down_proj.data, nullptr, hidden, projected_.data());
  apply_lora(LoraTarget::kDown, layer, gate_.data(), intermediate, projected_.data(), hidden);
  cpu::add_in_place(hidden_.data(), projected_.data(), n * hidden);
}

void CpuBackend::compute_logits(const Batch& batch, ForwardResult& result) {
  logit_tokens_.clear();
  for (const BatchSequence& sequence : batch.sequences) {
    const int32_t first = sequence.logits_for_all_tokens ? sequence.token_offset
                                                         : sequence.token_offset + sequence.num_new_tokens - 1;
    for (int32_t t = first; t < sequence.token_offset + sequence.num_new_tokens; ++t)
      logit_tokens_.push_back(t);
  }
  const int64_t num_rows = static_cast<int64_t>(logit_tokens_.size());
  const int64_t hidden = config_.hidden_size;
  for (int64_t r = 0; r < num_rows; ++r)
    std::memcpy(normed_.data() + r * hidden, hidden_.data() + logit_tokens_[r] * hidden,
                hidden * sizeof(float));
  cpu::rms_norm_rows(normed_.data(), num_rows, hidden, weights_->final_norm.data, config_.rms_norm_eps,
                     normed_.data());
  result.logits.resize(num_rows * config_.vocab_size);
  cpu::linear(normed_.data(), num_rows, hidden, weights_->lm_head.data, nullptr, config_.vocab_size,
              result.logits.data());
  result.logit_token_index.assign(logit_tokens_.begin(), logit_tokens_.end());
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const ModelConfig& config,
                                          std::shared_ptr<const ModelWeights> weights,
                                          const CpuBackendConfig& backend_config) {
  return std::make_unique<CpuBackend>(config, std::move(weights), backend_config);
}

}  // namespace loom
