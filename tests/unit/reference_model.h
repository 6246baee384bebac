// Test helpers for backends: tiny random llama-family models and LoRA adapters
// built in memory, and a naive dense forward pass (plain loops, double
// accumulation, no KV cache) to check a backend against.
// Header-only because CMake links only test_util.cc into every test.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <numbers>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "lora/adapter.h"
#include "model/config.h"
#include "model/weights.h"
#include "util/prng.h"

namespace loom::test {

// hidden 64, 4 heads / 2 kv heads of 16, intermediate 96, 2 layers, vocab 97.
inline ModelConfig tiny_config(Architecture arch) {
  ModelConfig config;
  config.arch = arch;
  config.vocab_size = 97;
  config.hidden_size = 64;
  config.intermediate_size = 96;
  config.num_layers = 2;
  config.num_heads = 4;
  config.num_kv_heads = 2;
  config.head_dim = 16;
  config.max_position_embeddings = 4096;
  config.rms_norm_eps = 1e-6f;
  config.rope_theta = 10000.0f;
  config.qkv_bias = arch == Architecture::kQwen2;
  config.qk_norm = arch == Architecture::kQwen3;
  return config;
}

inline Tensor random_tensor(Prng& prng, std::vector<int64_t> shape, float amplitude, float center = 0.0f) {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  std::vector<float> values(count);
  for (float& value : values) value = center + amplitude * prng.next_symmetric_float();
  return Tensor::from_vector(std::move(shape), std::move(values));
}

inline std::shared_ptr<ModelWeights> random_weights(const ModelConfig& config, uint64_t seed) {
  Prng prng(seed);
  auto weights = std::make_shared<ModelWeights>();
  const int64_t hidden = config.hidden_size;
  const int64_t q_size = config.q_size();
  const int64_t kv_size = config.kv_size();
  const int64_t intermediate = config.intermediate_size;
  // Amplitude ~ 1/sqrt(fan_in) keeps activations O(1) through the layers.
  const float hidden_scale = 1.7f / std::sqrt(static_cast<float>(hidden));
  weights->embed_tokens = random_tensor(prng, {config.vocab_size, hidden}, 1.0f);
  for (int l = 0; l < config.num_layers; ++l) {
    LayerWeights layer;
    layer.input_norm = random_tensor(prng, {hidden}, 0.2f, 1.0f);
    layer.q_proj = random_tensor(prng, {q_size, hidden}, hidden_scale);
    layer.k_proj = random_tensor(prng, {kv_size, hidden}, hidden_scale);
    layer.v_proj = random_tensor(prng, {kv_size, hidden}, hidden_scale);
    layer.o_proj = random_tensor(prng, {hidden, q_size}, 1.7f / std::sqrt(static_cast<float>(q_size)));
    if (config.qkv_bias) {
      layer.q_bias = random_tensor(prng, {q_size}, 0.3f);
      layer.k_bias = random_tensor(prng, {kv_size}, 0.3f);
      layer.v_bias = random_tensor(prng, {kv_size}, 0.3f);
    }
    if (config.o_bias) layer.o_bias = random_tensor(prng, {hidden}, 0.3f);
    if (config.qk_norm) {
      layer.q_norm = random_tensor(prng, {config.head_dim}, 0.2f, 1.0f);
      layer.k_norm = random_tensor(prng, {config.head_dim}, 0.2f, 1.0f);
    }
    layer.post_attention_norm = random_tensor(prng, {hidden}, 0.2f, 1.0f);
    layer.gate_proj = random_tensor(prng, {intermediate, hidden}, hidden_scale);
    layer.up_proj = random_tensor(prng, {intermediate, hidden}, hidden_scale);
    layer.down_proj =
        random_tensor(prng, {hidden, intermediate}, 1.7f / std::sqrt(static_cast<float>(intermediate)));
    weights->layers.push_back(std::move(layer));
  }
  weights->final_norm = random_tensor(prng, {hidden}, 0.2f, 1.0f);
  weights->lm_head = config.tie_word_embeddings ? weights->embed_tokens
                                                : random_tensor(prng, {config.vocab_size, hidden}, hidden_scale);
  return weights;
}

// [in_features, out_features] of q, k, v, o, gate, up, down.
inline std::array<std::array<int64_t, 2>, kNumLoraTargets> lora_module_dims(const ModelConfig& config) {
  const int64_t hidden = config.hidden_size;
  return {{{hidden, config.q_size()},
           {hidden, config.kv_size()},
           {hidden, config.kv_size()},
           {config.q_size(), hidden},
           {hidden, config.intermediate_size},
           {hidden, config.intermediate_size},
           {config.intermediate_size, hidden}}};
}

// An adapter targeting the modules with ranks[target] > 0, in every layer.
// scale = alpha / r, or alpha / sqrt(r) with rsLoRA. B is random (not PEFT's
// zero init) so that the adapter changes the output.
inline std::shared_ptr<LoraAdapter> random_adapter(const ModelConfig& config, uint64_t seed,
                                                   std::array<int, kNumLoraTargets> ranks, float alpha,
                                                   bool use_rslora = false) {
  Prng prng(seed);
  auto adapter = std::make_shared<LoraAdapter>();
  adapter->name = "adapter" + std::to_string(seed);
  adapter->config.alpha = alpha;
  adapter->config.use_rslora = use_rslora;
  const auto dims = lora_module_dims(config);
  adapter->layers.resize(config.num_layers);
  for (int l = 0; l < config.num_layers; ++l) {
    for (int target = 0; target < kNumLoraTargets; ++target) {
      const int rank = ranks[target];
      if (rank <= 0) continue;
      LoraModuleWeights module;
      module.rank = rank;
      module.scale = use_rslora ? alpha / std::sqrt(static_cast<float>(rank)) : alpha / rank;
      module.a = random_tensor(prng, {rank, dims[target][0]}, 1.0f / std::sqrt(static_cast<float>(dims[target][0])));
      module.b = random_tensor(prng, {dims[target][1], rank}, 0.5f / std::sqrt(static_cast<float>(rank)));
      adapter->layers[l][target] = std::move(module);
    }
  }
  return adapter;
}

namespace reference_detail {

using Matrix = std::vector<std::vector<double>>;  // [rows][cols]

inline std::vector<double> at(const Tensor& tensor, int64_t row, int64_t cols) {
  return std::vector<double>(tensor.data + row * cols, tensor.data + (row + 1) * cols);
}

// y = x W^T (+ b), W [out, in].
inline std::vector<double> linear(const std::vector<double>& x, const Tensor& weight, const Tensor* bias) {
  const int64_t out = weight.shape[0];
  const int64_t in = weight.shape[1];
  std::vector<double> y(out, 0.0);
  for (int64_t o = 0; o < out; ++o) {
    double sum = bias != nullptr && !bias->empty() ? bias->data[o] : 0.0;
    for (int64_t i = 0; i < in; ++i) sum += x[i] * weight.data[o * in + i];
    y[o] = sum;
  }
  return y;
}

inline void add_lora(const LoraAdapter* adapter, int layer, LoraTarget target, const std::vector<double>& x,
                     std::vector<double>& y) {
  if (adapter == nullptr) return;
  const auto& module = adapter->layers[layer][static_cast<int>(target)];
  if (!module.has_value()) return;
  const std::vector<double> low = linear(x, module->a, nullptr);
  const std::vector<double> delta = linear(low, module->b, nullptr);
  for (size_t i = 0; i < y.size(); ++i) y[i] += module->scale * delta[i];
}

inline std::vector<double> rms_norm(const double* x, int64_t width, const Tensor& weight, double eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < width; ++i) sum += x[i] * x[i];
  const double inverse = 1.0 / std::sqrt(sum / width + eps);
  std::vector<double> out(width);
  for (int64_t i = 0; i < width; ++i) out[i] = x[i] * inverse * weight.data[i];
  return out;
}

inline std::vector<double> inverse_frequencies(const ModelConfig& config) {
  const int half = config.head_dim / 2;
  std::vector<double> inv(half);
  for (int i = 0; i < half; ++i) inv[i] = 1.0 / std::pow(static_cast<double>(config.rope_theta), 2.0 * i / config.head_dim);
  if (config.rope_scaling.type != RopeScaling::Type::kLlama3) return inv;
  const RopeScaling& s = config.rope_scaling;
  const double old_context = s.original_max_position_embeddings;
  const double low_freq_wavelen = old_context / s.low_freq_factor;
  const double high_freq_wavelen = old_context / s.high_freq_factor;
  for (double& f : inv) {
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen < high_freq_wavelen) continue;
    if (wavelen > low_freq_wavelen) {
      f /= s.factor;
    } else {
      const double smooth = (old_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = (1.0 - smooth) * f / s.factor + smooth * f;
    }
  }
  return inv;
}

inline void rope(double* head, int head_dim, const std::vector<double>& inv, int64_t position) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double angle = static_cast<double>(position) * inv[i];
    const double c = std::cos(angle), s = std::sin(angle);
    const double x1 = head[i], x2 = head[i + half];
    head[i] = x1 * c - x2 * s;
    head[i + half] = x2 * c + x1 * s;
  }
}

}  // namespace reference_detail

// Logits [tokens.size()][vocab] of one sequence run from scratch: token t
// attends to tokens 0..t. adapters[t] is the adapter applied to token t (nullptr: base).
inline std::vector<std::vector<double>> reference_logits(const ModelConfig& config, const ModelWeights& weights,
                                                         const std::vector<int32_t>& tokens,
                                                         const std::vector<int32_t>& positions,
                                                         const std::vector<const LoraAdapter*>& adapters) {
  using namespace reference_detail;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t hidden = config.hidden_size;
  const int head_dim = config.head_dim;
  const int group = config.num_heads / config.num_kv_heads;
  const std::vector<double> inv = inverse_frequencies(config);
  Matrix x(n);
  for (int64_t t = 0; t < n; ++t) x[t] = at(weights.embed_tokens, tokens[t], hidden);

  for (int l = 0; l < config.num_layers; ++l) {
    const LayerWeights& w = weights.layers[l];
    Matrix q(n), k(n), v(n);
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<double> h = rms_norm(x[t].data(), hidden, w.input_norm, config.rms_norm_eps);
      q[t] = linear(h, w.q_proj, &w.q_bias);
      k[t] = linear(h, w.k_proj, &w.k_bias);
      v[t] = linear(h, w.v_proj, &w.v_bias);
      add_lora(adapters[t], l, LoraTarget::kQ, h, q[t]);
      add_lora(adapters[t], l, LoraTarget::kK, h, k[t]);
      add_lora(adapters[t], l, LoraTarget::kV, h, v[t]);
      for (int head = 0; head < config.num_heads; ++head) {
        double* qh = q[t].data() + head * head_dim;
        if (config.qk_norm) std::ranges::copy(rms_norm(qh, head_dim, w.q_norm, config.rms_norm_eps), qh);
        rope(qh, head_dim, inv, positions[t]);
      }
      for (int head = 0; head < config.num_kv_heads; ++head) {
        double* kh = k[t].data() + head * head_dim;
        if (config.qk_norm) std::ranges::copy(rms_norm(kh, head_dim, w.k_norm, config.rms_norm_eps), kh);
        rope(kh, head_dim, inv, positions[t]);
      }
    }
    for (int64_t t = 0; t < n; ++t) {
      std::vector<double> attention(config.q_size(), 0.0);
      for (int head = 0; head < config.num_heads; ++head) {
        const int kv_head = head / group;
        std::vector<double> scores(t + 1);
        double max_score = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0.0;
          for (int d = 0; d < head_dim; ++d) dot += q[t][head * head_dim + d] * k[j][kv_head * head_dim + d];
          scores[j] = dot / std::sqrt(static_cast<double>(head_dim));
          max_score = std::max(max_score, scores[j]);
        }
        double sum = 0.0;
        for (double& s : scores) sum += (s = std::exp(s - max_score));
        for (int64_t j = 0; j <= t; ++j)
          for (int d = 0; d < head_dim; ++d)
            attention[head * head_dim + d] += scores[j] / sum * v[j][kv_head * head_dim + d];
      }
      std::vector<double> o = linear(attention, w.o_proj, &w.o_bias);
      add_lora(adapters[t], l, LoraTarget::kO, attention, o);
      for (int64_t i = 0; i < hidden; ++i) x[t][i] += o[i];

      const std::vector<double> h = rms_norm(x[t].data(), hidden, w.post_attention_norm, config.rms_norm_eps);
      std::vector<double> gate = linear(h, w.gate_proj, nullptr);
      std::vector<double> up = linear(h, w.up_proj, nullptr);
      add_lora(adapters[t], l, LoraTarget::kGate, h, gate);
      add_lora(adapters[t], l, LoraTarget::kUp, h, up);
      for (size_t i = 0; i < gate.size(); ++i) gate[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
      std::vector<double> down = linear(gate, w.down_proj, nullptr);
      add_lora(adapters[t], l, LoraTarget::kDown, gate, down);
      for (int64_t i = 0; i < hidden; ++i) x[t][i] += down[i];
    }
  }
  Matrix logits(n);
  for (int64_t t = 0; t < n; ++t) {
    const std::vector<double> h = rms_norm(x[t].data(), hidden, weights.final_norm, config.rms_norm_eps);
    logits[t] = linear(h, weights.lm_head, nullptr);
  }
  return logits;
}

// A naive run of one sequence that keeps what the sharing tests compare:
// hidden[l][t] is token t's residual stream after the embedding (l = 0) and
// after layer l (before the final norm); keys/values[l][t] the K (after RoPE)
// and V its attention read; base_keys/base_values[l][t] the bCache of a forked
// run (RoPE(h W_k + b_k), h W_v + b_v, or the inherited entries).
struct ReferenceRun {
  using Matrix = std::vector<std::vector<double>>;
  Matrix logits;  // [tokens][vocab]
  std::vector<Matrix> hidden, keys, values, base_keys, base_values;
};

namespace reference_detail {

inline std::vector<double> project_q(const ModelConfig& config, const LayerWeights& w, int layer,
                                     const std::vector<double>& h, const LoraAdapter* adapter, int64_t position) {
  std::vector<double> q = linear(h, w.q_proj, &w.q_bias);
  add_lora(adapter, layer, LoraTarget::kQ, h, q);
  const std::vector<double> inv = inverse_frequencies(config);
  for (int head = 0; head < config.num_heads; ++head) {
    double* qh = q.data() + head * config.head_dim;
    if (config.qk_norm) std::ranges::copy(rms_norm(qh, config.head_dim, w.q_norm, config.rms_norm_eps), qh);
    rope(qh, config.head_dim, inv, position);
  }
  return q;
}

// RoPE over every kv head of a [kv_size] row (q/k norm first when asked).
inline void rope_kv_row(const ModelConfig& config, const LayerWeights& w, std::vector<double>& k, int64_t position,
                        bool with_norm) {
  const std::vector<double> inv = inverse_frequencies(config);
  for (int head = 0; head < config.num_kv_heads; ++head) {
    double* kh = k.data() + head * config.head_dim;
    if (with_norm && config.qk_norm)
      std::ranges::copy(rms_norm(kh, config.head_dim, w.k_norm, config.rms_norm_eps), kh);
    rope(kh, config.head_dim, inv, position);
  }
}

// Causal GQA attention of one query row over keys/values[0 .. count).
inline std::vector<double> attend(const ModelConfig& config, const std::vector<double>& q,
                                  const std::vector<std::vector<double>>& keys,
                                  const std::vector<std::vector<double>>& values, int64_t count) {
  const int head_dim = config.head_dim;
  const int group = config.num_heads / config.num_kv_heads;
  std::vector<double> attention(config.q_size(), 0.0);
  for (int head = 0; head < config.num_heads; ++head) {
    const int kv_head = head / group;
    std::vector<double> scores(count);
    double max_score = -1e300;
    for (int64_t j = 0; j < count; ++j) {
      double dot = 0.0;
      for (int d = 0; d < head_dim; ++d) dot += q[head * head_dim + d] * keys[j][kv_head * head_dim + d];
      scores[j] = dot / std::sqrt(static_cast<double>(head_dim));
      max_score = std::max(max_score, scores[j]);
    }
    double sum = 0.0;
    for (double& score : scores) sum += (score = std::exp(score - max_score));
    for (int64_t j = 0; j < count; ++j)
      for (int d = 0; d < head_dim; ++d)
        attention[head * head_dim + d] += scores[j] / sum * values[j][kv_head * head_dim + d];
  }
  return attention;
}

// o_proj, residual add, MLP and residual add of one row, `adapter` on o/gate/up/down.
inline void finish_layer(const ModelConfig& config, const LayerWeights& w, int layer,
                         const std::vector<double>& attention, const LoraAdapter* adapter, std::vector<double>& x) {
  const int64_t hidden = config.hidden_size;
  std::vector<double> o = linear(attention, w.o_proj, &w.o_bias);
  add_lora(adapter, layer, LoraTarget::kO, attention, o);
  for (int64_t i = 0; i < hidden; ++i) x[i] += o[i];
  const std::vector<double> h = rms_norm(x.data(), hidden, w.post_attention_norm, config.rms_norm_eps);
  std::vector<double> gate = linear(h, w.gate_proj, nullptr);
  std::vector<double> up = linear(h, w.up_proj, nullptr);
  add_lora(adapter, layer, LoraTarget::kGate, h, gate);
  add_lora(adapter, layer, LoraTarget::kUp, h, up);
  for (size_t i = 0; i < gate.size(); ++i) gate[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
  std::vector<double> down = linear(gate, w.down_proj, nullptr);
  add_lora(adapter, layer, LoraTarget::kDown, gate, down);
  for (int64_t i = 0; i < hidden; ++i) x[i] += down[i];
}

inline std::vector<double> logits_of(const ModelConfig& config, const ModelWeights& weights,
                                     const std::vector<double>& x) {
  return linear(rms_norm(x.data(), config.hidden_size, weights.final_norm, config.rms_norm_eps), weights.lm_head,
                nullptr);
}

// s * (h A^T) B^T of a module, or zeros when the adapter does not target it.
inline std::vector<double> lora_delta(const LoraAdapter& adapter, int layer, LoraTarget target,
                                      const std::vector<double>& h, int64_t out_features) {
  std::vector<double> delta(out_features, 0.0);
  add_lora(&adapter, layer, target, h, delta);
  return delta;
}

}  // namespace reference_detail

// One sequence from scratch at positions 0.. (like reference_logits), keeping
// hidden states, K and V. adapters[t] applies to every module of token t.
inline ReferenceRun reference_run(const ModelConfig& config, const ModelWeights& weights,
                                  const std::vector<int32_t>& tokens, const std::vector<const LoraAdapter*>& adapters) {
  using namespace reference_detail;
  const int64_t n = static_cast<int64_t>(tokens.size());
  ReferenceRun run;
  ReferenceRun::Matrix x(n);
  for (int64_t t = 0; t < n; ++t) x[t] = at(weights.embed_tokens, tokens[t], config.hidden_size);
  run.hidden.push_back(x);
  for (int l = 0; l < config.num_layers; ++l) {
    const LayerWeights& w = weights.layers[l];
    ReferenceRun::Matrix q(n), k(n), v(n);
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<double> h = rms_norm(x[t].data(), config.hidden_size, w.input_norm, config.rms_norm_eps);
      q[t] = project_q(config, w, l, h, adapters[t], t);
      k[t] = linear(h, w.k_proj, &w.k_bias);
      v[t] = linear(h, w.v_proj, &w.v_bias);
      add_lora(adapters[t], l, LoraTarget::kK, h, k[t]);
      add_lora(adapters[t], l, LoraTarget::kV, h, v[t]);
      rope_kv_row(config, w, k[t], t, /*with_norm=*/true);
    }
    for (int64_t t = 0; t < n; ++t) finish_layer(config, w, l, attend(config, q[t], k, v, t + 1), adapters[t], x[t]);
    run.keys.push_back(std::move(k));
    run.values.push_back(std::move(v));
    run.hidden.push_back(x);
  }
  for (int64_t t = 0; t < n; ++t) run.logits.push_back(logits_of(config, weights, x[t]));
  return run;
}

// ICaRus' logical decoder at token p: base + `adapter` on q, o and the MLP (never
// k/v), attending to the base model's K/V of tokens 0..p (`base`, a reference_run
// without adapters). Returns one row: logits[0], hidden[l][0].
inline ReferenceRun reference_decoder_row(const ModelConfig& config, const ModelWeights& weights,
                                          const std::vector<int32_t>& tokens, const ReferenceRun& base,
                                          const LoraAdapter& adapter, int64_t p) {
  using namespace reference_detail;
  ReferenceRun run;
  std::vector<double> x = at(weights.embed_tokens, tokens[p], config.hidden_size);
  run.hidden.push_back({x});
  for (int l = 0; l < config.num_layers; ++l) {
    const LayerWeights& w = weights.layers[l];
    const std::vector<double> h = rms_norm(x.data(), config.hidden_size, w.input_norm, config.rms_norm_eps);
    const std::vector<double> q = project_q(config, w, l, h, &adapter, p);
    finish_layer(config, w, l, attend(config, q, base.keys[l], base.values[l], p + 1), &adapter, x);
    run.hidden.push_back({x});
  }
  run.logits.push_back(logits_of(config, weights, x));
  return run;
}

// A ForkKV agent with `adapter` over `tokens` (positions 0..), K/V built
// explicitly: K_t = bK_t + RoPE_t(s_k (h A_k^T) B_k^T), V_t = bV_t + s_v (h A_v^T) B_v^T,
// where bK_t, bV_t are this run's base projections, or `inherited`'s bCache for
// t < num_inherited (another agent's entries).
inline ReferenceRun reference_forked(const ModelConfig& config, const ModelWeights& weights,
                                     const std::vector<int32_t>& tokens, const LoraAdapter& adapter,
                                     const ReferenceRun* inherited = nullptr, int64_t num_inherited = 0) {
  using namespace reference_detail;
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t kv_size = config.kv_size();
  ReferenceRun run;
  ReferenceRun::Matrix x(n);
  for (int64_t t = 0; t < n; ++t) x[t] = at(weights.embed_tokens, tokens[t], config.hidden_size);
  run.hidden.push_back(x);
  for (int l = 0; l < config.num_layers; ++l) {
    const LayerWeights& w = weights.layers[l];
    ReferenceRun::Matrix q(n), k(n), v(n), base_k(n), base_v(n);
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<double> h = rms_norm(x[t].data(), config.hidden_size, w.input_norm, config.rms_norm_eps);
      q[t] = project_q(config, w, l, h, &adapter, t);
      if (t < num_inherited) {
        base_k[t] = inherited->base_keys[l][t];
        base_v[t] = inherited->base_values[l][t];
      } else {
        base_k[t] = linear(h, w.k_proj, &w.k_bias);
        rope_kv_row(config, w, base_k[t], t, /*with_norm=*/false);
        base_v[t] = linear(h, w.v_proj, &w.v_bias);
      }
      std::vector<double> lora_k = lora_delta(adapter, l, LoraTarget::kK, h, kv_size);
      rope_kv_row(config, w, lora_k, t, /*with_norm=*/false);
      const std::vector<double> lora_v = lora_delta(adapter, l, LoraTarget::kV, h, kv_size);
      k[t] = base_k[t];
      v[t] = base_v[t];
      for (int64_t i = 0; i < kv_size; ++i) {
        k[t][i] += lora_k[i];
        v[t][i] += lora_v[i];
      }
    }
    for (int64_t t = 0; t < n; ++t) finish_layer(config, w, l, attend(config, q[t], k, v, t + 1), &adapter, x[t]);
    run.keys.push_back(std::move(k));
    run.values.push_back(std::move(v));
    run.base_keys.push_back(std::move(base_k));
    run.base_values.push_back(std::move(base_v));
    run.hidden.push_back(x);
  }
  for (int64_t t = 0; t < n; ++t) run.logits.push_back(logits_of(config, weights, x[t]));
  return run;
}

// One sequence of a batch, as the tests describe it.
struct SequenceInput {
  std::vector<int32_t> tokens;     // new tokens
  std::vector<int32_t> positions;  // empty: num_cached .. num_cached + tokens.size()
  std::vector<int32_t> adapter_slots;  // empty: all `adapter_slot`
  int32_t adapter_slot = -1;
  int32_t num_computed_tokens = 0;
  std::vector<int32_t> block_ids;
  bool logits_for_all_tokens = false;
  // KV sharing (backend.h).
  int32_t num_kv_present_tokens = 0;
  int32_t decoder_adapter_slot = -1;
  int32_t forked_adapter_slot = -1;
  std::vector<int32_t> residual_block_ids;
  int32_t num_residual_present_tokens = 0;
};

inline Batch make_batch(const std::vector<SequenceInput>& inputs) {
  Batch batch;
  for (const SequenceInput& input : inputs) {
    BatchSequence sequence;
    sequence.num_computed_tokens = input.num_computed_tokens;
    sequence.num_new_tokens = static_cast<int32_t>(input.tokens.size());
    sequence.token_offset = batch.num_tokens();
    sequence.block_table_offset = static_cast<int32_t>(batch.block_tables.size());
    sequence.num_blocks = static_cast<int32_t>(input.block_ids.size());
    sequence.logits_for_all_tokens = input.logits_for_all_tokens;
    sequence.num_kv_present_tokens = input.num_kv_present_tokens;
    sequence.decoder_adapter_slot = input.decoder_adapter_slot;
    sequence.forked_adapter_slot = input.forked_adapter_slot;
    sequence.residual_block_table_offset = static_cast<int32_t>(batch.residual_block_tables.size());
    sequence.num_residual_blocks = static_cast<int32_t>(input.residual_block_ids.size());
    sequence.num_residual_present_tokens = input.num_residual_present_tokens;
    batch.residual_block_tables.insert(batch.residual_block_tables.end(), input.residual_block_ids.begin(),
                                       input.residual_block_ids.end());
    for (size_t i = 0; i < input.tokens.size(); ++i) {
      batch.token_ids.push_back(input.tokens[i]);
      batch.positions.push_back(input.positions.empty() ? input.num_computed_tokens + static_cast<int32_t>(i)
                                                        : input.positions[i]);
      batch.adapter_slots.push_back(input.adapter_slots.empty() ? input.adapter_slot : input.adapter_slots[i]);
    }
    batch.block_tables.insert(batch.block_tables.end(), input.block_ids.begin(), input.block_ids.end());
    batch.sequences.push_back(sequence);
  }
  return batch;
}

// Max |a - b| over a row of float logits against a reference row.
inline double max_abs_diff(const float* logits, const std::vector<double>& reference) {
  double worst = 0.0;
  for (size_t i = 0; i < reference.size(); ++i) worst = std::max(worst, std::abs(logits[i] - reference[i]));
  return worst;
}

// max |a - b| / max |b| over a row of float logits against a reference row.
inline double relative_diff(const float* logits, const std::vector<double>& reference) {
  double largest = 0.0;
  for (double value : reference) largest = std::max(largest, std::abs(value));
  return max_abs_diff(logits, reference) / std::max(largest, 1e-30);
}

inline std::vector<int32_t> random_tokens(uint64_t seed, int count, int vocab_size) {
  Prng prng(seed);
  std::vector<int32_t> tokens(count);
  for (int32_t& token : tokens) token = static_cast<int32_t>(prng.next_below(vocab_size));
  return tokens;
}

}  // namespace loom::test
