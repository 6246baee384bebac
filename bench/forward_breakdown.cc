#include "forward_breakdown.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <random>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/paged_attention.h"
#include "backend/rope.h"

namespace loom::bench {
namespace {

double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

// Median seconds of `body` (one whole forward's worth of a section), after one warm-up call.
double time_section(const std::function<void()>& body, int num_repeats) {
  body();
  std::vector<double> samples;
  for (int i = 0; i < num_repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    body();
    samples.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return median_of(samples);
}

std::vector<float> random_floats(int64_t count, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& value : values) value = normal(rng);
  return values;
}

}  // namespace

std::vector<BreakdownSection> measure_forward_breakdown(const LoadedModel& model, const Batch& batch,
                                                        int num_logit_rows, int block_size,
                                                        int num_threads, int num_repeats) {
  const ModelConfig& config = model.config;
  const ModelWeights& weights = *model.weights;
  const int64_t n = batch.num_tokens();
  const int64_t hidden = config.hidden_size;
  const int64_t q_size = config.q_size();
  const int64_t kv_size = config.kv_size();
  const int64_t intermediate = config.intermediate_size;
  const int num_layers = config.num_layers;
  omp_set_num_threads(num_threads);

  std::mt19937 rng(7);
  std::vector<float> x = random_floats(n * std::max(hidden, intermediate), rng);
  std::vector<float> q(n * q_size), k(n * kv_size), v(n * kv_size), attention_out(n * q_size);
  std::vector<float> projected(n * hidden), gate(n * intermediate), up(n * intermediate);
  std::vector<float> logits(static_cast<size_t>(num_logit_rows) * config.vocab_size);
  std::vector<float> normed(n * hidden);

  std::vector<BreakdownSection> sections;
  auto add = [&](const char* name, const std::function<void()>& body) {
    sections.push_back({name, time_section(body, num_repeats)});
  };
  add("qkv_proj", [&] {
    for (const LayerWeights& layer : weights.layers) {
      cpu::linear(x.data(), n, hidden, layer.q_proj, nullptr, q_size, q.data());
      cpu::linear(x.data(), n, hidden, layer.k_proj, nullptr, kv_size, k.data());
      cpu::linear(x.data(), n, hidden, layer.v_proj, nullptr, kv_size, v.data());
    }
  });
  add("o_proj", [&] {
    for (const LayerWeights& layer : weights.layers)
      cpu::linear(x.data(), n, q_size, layer.o_proj, nullptr, hidden, projected.data());
  });
  add("gate_up_proj", [&] {
    for (const LayerWeights& layer : weights.layers) {
      cpu::linear(x.data(), n, hidden, layer.gate_proj, nullptr, intermediate, gate.data());
      cpu::linear(x.data(), n, hidden, layer.up_proj, nullptr, intermediate, up.data());
    }
  });
  add("down_proj", [&] {
    for (const LayerWeights& layer : weights.layers)
      cpu::linear(x.data(), n, intermediate, layer.down_proj, nullptr, hidden, projected.data());
  });
  add("lm_head", [&] {
    cpu::linear(x.data(), num_logit_rows, hidden, weights.lm_head, nullptr, config.vocab_size,
                logits.data());
  });

  int32_t max_block_id = 0;
  for (int32_t id : batch.block_tables) max_block_id = std::max(max_block_id, id);
  const int64_t pool_floats = static_cast<int64_t>(max_block_id + 1) * block_size * kv_size;
  std::vector<float> k_pool = random_floats(pool_floats, rng), v_pool = random_floats(pool_floats, rng);
  cpu::TokenPlacement placement;
  cpu::place_tokens(batch, block_size, placement);
  const cpu::AttentionShape shape{config.num_heads, config.num_kv_heads, config.head_dim, block_size};
  std::vector<float> scores;
  std::vector<float> queries = random_floats(n * q_size, rng);
  add("attention", [&] {
    for (int layer = 0; layer < num_layers; ++layer) {
      cpu::write_kv(k.data(), v.data(), placement, kv_size, k_pool.data(), v_pool.data());
      cpu::paged_attention(queries.data(), batch, placement, shape, k_pool.data(), v_pool.data(),
                           num_threads, scores, attention_out.data());
    }
  });

  const Rope rope(config);
  const int64_t half = config.head_dim / 2;
  std::vector<float> cos_table(n * half), sin_table(n * half);
  add("norms_rope_silu_residual", [&] {
    for (int64_t t = 0; t < n; ++t)
      rope.cos_sin(batch.positions[t], cos_table.data() + t * half, sin_table.data() + t * half);
    for (const LayerWeights& layer : weights.layers) {
      cpu::rms_norm_rows(x.data(), n, hidden, layer.input_norm.data, config.rms_norm_eps, normed.data());
#pragma omp parallel for if (n >= 8)
      for (int64_t t = 0; t < n; ++t) {
        rope.rotate(q.data() + t * q_size, config.num_heads, cos_table.data() + t * half,
                    sin_table.data() + t * half);
        rope.rotate(k.data() + t * kv_size, config.num_kv_heads, cos_table.data() + t * half,
                    sin_table.data() + t * half);
      }
      cpu::add_in_place(projected.data(), normed.data(), n * hidden);
      cpu::rms_norm_rows(x.data(), n, hidden, layer.post_attention_norm.data, config.rms_norm_eps,
                         normed.data());
      cpu::silu_multiply(gate.data(), up.data(), n * intermediate);
      cpu::add_in_place(projected.data(), normed.data(), n * hidden);
    }
  });
  return sections;
}

}  // namespace loom::bench
