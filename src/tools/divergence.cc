#include "tools/divergence.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <optional>

#include <fmt/format.h>

#include "synthetic/synthetic_model.h"
#include "synthetic/synthetic_weights.h"
#include "util/error.h"
#include "util/prng.h"

// Lanes are filled with designated initializers, leaving defaults out on purpose.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace loom {

const char* divergence_mode_name(DivergenceMode mode) {
  switch (mode) {
    case DivergenceMode::kBaseModel: return "base-model";
    case DivergenceMode::kBase: return "base";
    case DivergenceMode::kForked: return "forked";
    case DivergenceMode::kActivated: return "activated";
  }
  return "?";
}

const char* forked_writer_name(ForkedWriter writer) {
  switch (writer) {
    case ForkedWriter::kBaseModel: return "base-model";
    case ForkedWriter::kAdapter: return "adapter";
    case ForkedWriter::kSelf: return "self";
  }
  return "?";
}

double logit_kl_divergence(const float* p_logits, const float* q_logits, int64_t vocab_size) {
  double p_max = -INFINITY, q_max = -INFINITY;
  for (int64_t i = 0; i < vocab_size; ++i) {
    p_max = std::max(p_max, static_cast<double>(p_logits[i]));
    q_max = std::max(q_max, static_cast<double>(q_logits[i]));
  }
  double p_sum = 0.0, q_sum = 0.0;
  for (int64_t i = 0; i < vocab_size; ++i) {
    p_sum += std::exp(p_logits[i] - p_max);
    q_sum += std::exp(q_logits[i] - q_max);
  }
  const double p_log_norm = p_max + std::log(p_sum);
  const double q_log_norm = q_max + std::log(q_sum);
  double kl = 0.0;
  for (int64_t i = 0; i < vocab_size; ++i) {
    const double log_p = p_logits[i] - p_log_norm;
    const double log_q = q_logits[i] - q_log_norm;
    kl += std::exp(log_p) * (log_p - log_q);
  }
  return std::max(kl, 0.0);  // rounding can leave a tiny negative value for equal rows
}

double cosine_similarity(const float* a, const float* b, int64_t size) {
  double dot = 0.0, a_norm = 0.0, b_norm = 0.0;
  for (int64_t i = 0; i < size; ++i) {
    dot += static_cast<double>(a[i]) * b[i];
    a_norm += static_cast<double>(a[i]) * a[i];
    b_norm += static_cast<double>(b[i]) * b[i];
  }
  if (a_norm == 0.0 && b_norm == 0.0) return 1.0;
  if (a_norm == 0.0 || b_norm == 0.0) return 0.0;
  return dot / std::sqrt(a_norm * b_norm);
}

DivergenceStats average_divergence(const std::vector<DivergenceStats>& stats) {
  DivergenceStats mean;
  if (stats.empty()) return mean;
  mean.layer_cosine.assign(stats.front().layer_cosine.size(), 0.0);
  double num_positions = 0.0, num_generated = 0.0, first_divergence = 0.0;
  for (const DivergenceStats& s : stats) {
    if (s.layer_cosine.size() != mean.layer_cosine.size())
      fail(ErrorKind::kInvalidArgument, "average_divergence: {} and {} layers", s.layer_cosine.size(),
           mean.layer_cosine.size());
    for (size_t l = 0; l < s.layer_cosine.size(); ++l) mean.layer_cosine[l] += s.layer_cosine[l] * s.num_positions;
    mean.mean_kl += s.mean_kl * s.num_positions;
    mean.max_kl = std::max(mean.max_kl, s.max_kl);
    mean.teacher_forced_agreement += s.teacher_forced_agreement * s.num_generated_tokens;
    mean.free_running_agreement += s.free_running_agreement * s.num_generated_tokens;
    num_positions += s.num_positions;
    num_generated += s.num_generated_tokens;
    first_divergence += s.first_divergence;
    mean.num_positions += s.num_positions;
    mean.num_generated_tokens += s.num_generated_tokens;
  }
  if (num_positions > 0) {
    for (double& c : mean.layer_cosine) c /= num_positions;
    mean.mean_kl /= num_positions;
  }
  if (num_generated > 0) {
    mean.teacher_forced_agreement /= num_generated;
    mean.free_running_agreement /= num_generated;
  }
  mean.first_divergence = static_cast<int32_t>(first_divergence / static_cast<double>(stats.size()));
  return mean;
}

namespace {

// How one sequence runs: its slots and sharing fields, and its block tables
// (context blocks first, then the continuation's).
struct Lane {
  std::vector<int32_t> main_blocks;
  std::vector<int32_t> residual_blocks;  // forked only
  int32_t context_slot = -1;             // adapter slot of tokens at index < context_end
  int32_t slot = -1;                     // adapter slot of the later tokens
  int32_t context_end = 0;
  int32_t decoder_slot = -1;
  int32_t forked_slot = -1;
};

// The logits rows and hidden states of the last `num_rows` new tokens of a run.
struct Trace {
  int32_t num_rows = 0;
  std::vector<float> logits;  // [num_rows, vocab]
  std::vector<float> hidden;  // [num_layers + 1, num_rows, hidden]
};

class Runner {
 public:
  Runner(Backend& backend, const ModelConfig& config) : backend_(backend), config_(config) {}

  // tokens[start, start + count) as new tokens; entries [0, start) are in KV.
  ForwardResult run(const Lane& lane, const std::vector<int32_t>& tokens, int32_t start, int32_t count,
                    bool logits_for_all_tokens, bool capture_hidden_states, int32_t num_kv_present_tokens = 0) {
    Batch batch;
    for (int32_t i = start; i < start + count; ++i) {
      batch.token_ids.push_back(tokens[i]);
      batch.positions.push_back(i);
      batch.adapter_slots.push_back(i < lane.context_end ? lane.context_slot : lane.slot);
    }
    BatchSequence sequence;
    sequence.num_computed_tokens = start;
    sequence.num_new_tokens = count;
    sequence.num_blocks = static_cast<int32_t>(lane.main_blocks.size());
    sequence.logits_for_all_tokens = logits_for_all_tokens;
    sequence.num_kv_present_tokens = num_kv_present_tokens;
    sequence.decoder_adapter_slot = lane.decoder_slot;
    sequence.forked_adapter_slot = lane.forked_slot;
    sequence.num_residual_blocks = static_cast<int32_t>(lane.residual_blocks.size());
    batch.sequences.push_back(sequence);
    batch.block_tables = lane.main_blocks;
    batch.residual_block_tables = lane.residual_blocks;
    batch.capture_hidden_states = capture_hidden_states;
    return backend_.forward(batch);
  }

  // Greedy decoding of `num_tokens` tokens after `prompt`, whose entries [0, start) are in KV.
  std::vector<int32_t> greedy(const Lane& lane, const std::vector<int32_t>& prompt, int32_t start,
                              int32_t num_tokens) {
    std::vector<int32_t> tokens = prompt;
    std::vector<int32_t> generated;
    ForwardResult result = run(lane, tokens, start, static_cast<int32_t>(tokens.size()) - start, false, false);
    for (;;) {
      generated.push_back(argmax(result.logits.data()));
      if (static_cast<int32_t>(generated.size()) == num_tokens) return generated;
      tokens.push_back(generated.back());
      result = run(lane, tokens, static_cast<int32_t>(tokens.size()) - 1, 1, false, false);
    }
  }

  // One forward over tokens[start, end) with logits and hidden states for every
  // new token; keeps the last `num_rows`.
  Trace teacher_forced(const Lane& lane, const std::vector<int32_t>& tokens, int32_t start, int32_t num_rows) {
    const int32_t count = static_cast<int32_t>(tokens.size()) - start;
    const ForwardResult result = run(lane, tokens, start, count, true, true);
    const int64_t vocab = config_.vocab_size;
    const int64_t hidden = config_.hidden_size;
    const int32_t skip = count - num_rows;
    Trace trace;
    trace.num_rows = num_rows;
    trace.logits.assign(result.logits.begin() + skip * vocab, result.logits.end());
    const int64_t num_layers = config_.num_layers + 1;
    trace.hidden.resize(num_layers * num_rows * hidden);
    for (int64_t l = 0; l < num_layers; ++l)
      std::copy_n(result.hidden_states.begin() + (l * count + skip) * hidden, num_rows * hidden,
                  trace.hidden.begin() + l * num_rows * hidden);
    return trace;
  }

  int32_t argmax(const float* logits) const {
    return static_cast<int32_t>(std::max_element(logits, logits + config_.vocab_size) - logits);
  }

 private:
  Backend& backend_;
  const ModelConfig& config_;
};

// Consecutive block ids handed out in order; never freed within a measurement.
class BlockRange {
 public:
  std::vector<int32_t> take(int32_t count) {
    std::vector<int32_t> blocks(count);
    for (int32_t& block : blocks) block = next_++;
    return blocks;
  }
 private:
  int32_t next_ = 0;
};

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A reference (or mode) run: its greedy path and its teacher-forced trace.
struct Outcome {
  std::vector<int32_t> path;
  Trace trace;
};

DivergenceStats compare(const ModelConfig& config, const Outcome& reference, const Outcome& mode, int32_t suffix_length,
                        const Runner& runner) {
  const int32_t num_rows = reference.trace.num_rows;
  const int64_t vocab = config.vocab_size;
  const int64_t hidden = config.hidden_size;
  const int32_t num_generated = static_cast<int32_t>(reference.path.size());
  DivergenceStats stats;
  stats.num_positions = num_rows;
  stats.num_generated_tokens = num_generated;
  stats.layer_cosine.assign(config.num_layers + 1, 0.0);
  for (int64_t l = 0; l <= config.num_layers; ++l) {
    double sum = 0.0;
    for (int64_t r = 0; r < num_rows; ++r) {
      const int64_t offset = (l * num_rows + r) * hidden;
      sum += cosine_similarity(reference.trace.hidden.data() + offset, mode.trace.hidden.data() + offset, hidden);
    }
    stats.layer_cosine[l] = sum / num_rows;
  }
  for (int64_t r = 0; r < num_rows; ++r) {
    const double kl = logit_kl_divergence(reference.trace.logits.data() + r * vocab, mode.trace.logits.data() + r * vocab,
                                          vocab);
    stats.kl_by_position.push_back(kl);
    stats.mean_kl += kl / num_rows;
    stats.max_kl = std::max(stats.max_kl, kl);
  }
  int32_t num_agreeing = 0;
  for (int32_t k = 0; k < num_generated; ++k) {
    const int64_t r = suffix_length - 1 + k;
    num_agreeing += runner.argmax(reference.trace.logits.data() + r * vocab) ==
                    runner.argmax(mode.trace.logits.data() + r * vocab);
  }
  stats.teacher_forced_agreement = static_cast<double>(num_agreeing) / num_generated;
  stats.first_divergence = num_generated;
  for (int32_t k = 0; k < num_generated; ++k)
    if (reference.path[k] != mode.path[k]) {
      stats.first_divergence = k;
      break;
    }
  stats.free_running_agreement = static_cast<double>(stats.first_divergence) / num_generated;
  stats.reference_tokens = reference.path;
  stats.mode_tokens = mode.path;
  return stats;
}

void check_inputs(Backend& backend, const ModelConfig& config, const DivergencePrompt& prompt, int32_t reader_slot,
                  const std::vector<DivergenceCase>& cases, const DivergenceOptions& options) {
  if (prompt.context.empty() || prompt.suffix.empty())
    fail(ErrorKind::kInvalidArgument, "divergence: the context ({} tokens) and the suffix ({} tokens) must not be empty",
         prompt.context.size(), prompt.suffix.size());
  if (options.num_generated_tokens < 1)
    fail(ErrorKind::kInvalidArgument, "divergence: {} generated tokens, need at least 1", options.num_generated_tokens);
  if (options.block_size < 1) fail(ErrorKind::kInvalidArgument, "divergence: block size {}", options.block_size);
  const int64_t length =
      static_cast<int64_t>(prompt.context.size()) + prompt.suffix.size() + options.num_generated_tokens;
  if (length > config.max_position_embeddings)
    fail(ErrorKind::kInvalidArgument, "divergence: {} tokens exceed the model's {} positions", length,
         config.max_position_embeddings);
  auto check_slot = [&](int32_t slot, const char* what) {
    if (slot < 0 || slot >= backend.max_adapter_slots())
      fail(ErrorKind::kInvalidArgument, "divergence: {} slot {} outside [0, {})", what, slot,
           backend.max_adapter_slots());
  };
  check_slot(reader_slot, "reader");
  for (const DivergenceCase& c : cases) {
    if (c.mode != DivergenceMode::kForked) continue;
    if (options.residual_max_rank < 1)
      fail(ErrorKind::kInvalidArgument, "divergence: a forked case needs residual_max_rank >= 1");
    if (c.writer == ForkedWriter::kAdapter) check_slot(c.writer_slot, "forked writer");
  }
}

}  // namespace

std::vector<DivergenceStats> measure_divergence(Backend& backend, const ModelConfig& config,
                                                const DivergencePrompt& prompt, int32_t reader_slot,
                                                const std::vector<DivergenceCase>& cases,
                                                const DivergenceOptions& options) {
  check_inputs(backend, config, prompt, reader_slot, cases, options);
  const int32_t num_context = static_cast<int32_t>(prompt.context.size());
  const int32_t num_suffix = static_cast<int32_t>(prompt.suffix.size());
  const int32_t num_generated = options.num_generated_tokens;
  const int32_t num_rows = num_suffix + num_generated - 1;
  const int32_t block_size = options.block_size;
  const int32_t total = num_context + num_suffix + num_generated;
  auto blocks_for = [&](int32_t tokens) { return (tokens + block_size - 1) / block_size; };
  const int32_t context_blocks = blocks_for(num_context);
  const int32_t all_blocks = blocks_for(total);
  // The continuation of a lane whose context fills `context_blocks`: the rest of `all_blocks`.
  const int32_t continuation_blocks = all_blocks - context_blocks;

  // Main pool: base-model context, writer context, own context, one-shot run, continuation.
  const int32_t num_main_blocks = 3 * context_blocks + all_blocks + continuation_blocks;
  const KvCacheShape kv_shape = backend.kv_cache_shape();
  if (kv_shape.block_size != block_size || kv_shape.num_blocks < num_main_blocks)
    backend.allocate_kv_cache({num_main_blocks, block_size});
  const bool has_forked = std::any_of(cases.begin(), cases.end(),
                                      [](const DivergenceCase& c) { return c.mode == DivergenceMode::kForked; });
  // rCache pool: writer context, reader context, continuation.
  const int32_t num_residual_blocks = 2 * context_blocks + continuation_blocks;
  if (has_forked) {
    const ResidualCacheShape shape = backend.residual_cache_shape();
    if (shape.block_size != block_size || shape.num_blocks < num_residual_blocks ||
        shape.max_rank < options.residual_max_rank)
      backend.allocate_residual_cache({num_residual_blocks, block_size, options.residual_max_rank});
  }
  BlockRange main_range, residual;
  const std::vector<int32_t> base_context = main_range.take(context_blocks);
  const std::vector<int32_t> writer_context = main_range.take(context_blocks);
  const std::vector<int32_t> own_context = main_range.take(context_blocks);
  const std::vector<int32_t> one_shot = main_range.take(all_blocks);
  const std::vector<int32_t> continuation = main_range.take(continuation_blocks);
  const std::vector<int32_t> writer_residual = residual.take(context_blocks);
  const std::vector<int32_t> reader_residual = residual.take(context_blocks);
  const std::vector<int32_t> residual_continuation = residual.take(continuation_blocks);
  // Entries >= num_context of a lane live in its last context block, then in the continuation.
  auto with_continuation = [&](const std::vector<int32_t>& context, const std::vector<int32_t>& rest) {
    return concat(context, rest);
  };

  Runner runner(backend, config);
  const std::vector<int32_t> prompt_tokens = concat(prompt.context, prompt.suffix);
  // The greedy path from `start` on, then the teacher-forced trace from the
  // context's end on `path_to_follow` (its own path when null).
  auto outcome = [&](const Lane& lane, int32_t start, const std::vector<int32_t>* path_to_follow) {
    Outcome result;
    result.path = runner.greedy(lane, prompt_tokens, start, num_generated);
    const std::vector<int32_t>& path = path_to_follow != nullptr ? *path_to_follow : result.path;
    std::vector<int32_t> tokens = prompt_tokens;
    tokens.insert(tokens.end(), path.begin(), path.end() - 1);
    result.trace = runner.teacher_forced(lane, tokens, num_context, num_rows);
    return result;
  };

  // The base model's K/V of the context: the base namespace every sharing mode reads.
  const bool needs_base_context = std::any_of(cases.begin(), cases.end(), [](const DivergenceCase& c) {
    return c.mode != DivergenceMode::kForked || c.writer == ForkedWriter::kBaseModel;
  });
  if (needs_base_context) runner.run({.main_blocks = base_context}, prompt.context, 0, num_context, false, false);

  std::optional<Outcome> isolated, masked;
  std::vector<DivergenceStats> results;
  for (const DivergenceCase& c : cases) {
    if (c.mode == DivergenceMode::kActivated) {
      if (!masked) {  // one prefill over C + S with the aLoRA mask, its own KV (the context's kept after)
        const Lane lane{.main_blocks = one_shot, .context_slot = -1, .slot = reader_slot, .context_end = num_context};
        masked = outcome(lane, 0, nullptr);
      }
      const Lane lane{.main_blocks = with_continuation(base_context, continuation), .slot = reader_slot};
      results.push_back(compare(config, *masked, outcome(lane, num_context, &masked->path), num_suffix, runner));
      continue;
    }
    if (!isolated) {
      const Lane lane{.main_blocks = with_continuation(own_context, continuation), .context_slot = reader_slot,
                      .slot = reader_slot, .context_end = num_context};
      runner.run(lane, prompt.context, 0, num_context, false, false);
      isolated = outcome(lane, num_context, nullptr);
    }
    Lane lane;
    switch (c.mode) {
      case DivergenceMode::kBaseModel:
        lane = {.main_blocks = with_continuation(base_context, continuation)};
        break;
      case DivergenceMode::kBase:
        lane = {.main_blocks = with_continuation(base_context, continuation), .decoder_slot = reader_slot};
        break;
      case DivergenceMode::kForked: {
        std::vector<int32_t> bcache = base_context;
        if (c.writer != ForkedWriter::kBaseModel) {
          const int32_t writer = c.writer == ForkedWriter::kSelf ? reader_slot : c.writer_slot;
          const Lane writer_lane{.main_blocks = writer_context, .residual_blocks = writer_residual,
                                 .context_slot = writer, .slot = writer, .context_end = num_context,
                                 .forked_slot = writer};
          runner.run(writer_lane, prompt.context, 0, num_context, false, false);
          bcache = writer_context;
        }
        // On its own bCache the reader also has its rCache (a full hit); else it
        // recomputes its rCache over the context, the writer's bCache present, read only.
        const bool is_own = c.writer == ForkedWriter::kSelf;
        lane = {.main_blocks = with_continuation(bcache, continuation),
                .residual_blocks = with_continuation(is_own ? writer_residual : reader_residual, residual_continuation),
                .context_slot = reader_slot, .slot = reader_slot, .context_end = num_context,
                .forked_slot = reader_slot};
        if (!is_own) runner.run(lane, prompt.context, 0, num_context, false, false, num_context);
        break;
      }
      case DivergenceMode::kActivated:
        break;  // handled above
    }
    results.push_back(compare(config, *isolated, outcome(lane, num_context, &isolated->path), num_suffix, runner));
  }
  return results;
}

namespace {

// ||W||_F of layer `layer`'s projection `target`: measured, or expected under the synthetic draw.
double frobenius_norm(const ModelConfig& config, const ModelWeights* weights, int layer, int target) {
  static const char* const kNames[kNumLoraTargets] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                       "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                                       "mlp.down_proj"};
  if (weights != nullptr) {
    const LayerWeights& base = weights->layers[layer];
    const Tensor* tensors[kNumLoraTargets] = {&base.q_proj,    &base.k_proj,  &base.v_proj,   &base.o_proj,
                                              &base.gate_proj, &base.up_proj, &base.down_proj};
    double squares = 0.0;
    const Tensor w = to_fp32(*tensors[target]);
    for (int64_t i = 0; i < w.numel(); ++i) squares += static_cast<double>(w.data[i]) * w.data[i];
    return std::sqrt(squares);
  }
  const std::string name = fmt::format("model.layers.{}.{}.weight", layer, kNames[target]);
  for (const SyntheticTensorSpec& spec : synthetic_base_tensor_specs(config))
    if (spec.name == name) return std::sqrt(static_cast<double>(spec.numel()) / 3.0) * spec.scale;
  fail(ErrorKind::kInvalidArgument, "random LoRA: no synthetic tensor {}", name);
}

}  // namespace

RandomLora make_random_lora(const ModelConfig& config, const ModelWeights* weights, const RandomLoraOptions& options) {
  if (!(options.relative_norm > 0.0f) && !(options.b_sigma > 0.0f))
    fail(ErrorKind::kInvalidArgument, "random LoRA '{}': give a positive relative norm or B sigma", options.name);
  SyntheticModelOptions synthetic;
  synthetic.num_adapters = 1;
  synthetic.rank = options.rank;
  synthetic.alpha = options.alpha;
  synthetic.targets = options.targets;
  synthetic.seed = options.seed;
  std::vector<SyntheticAdapterSpec> specs = synthetic_adapter_specs(synthetic, config);
  specs.front().name = options.name;
  specs.front().config.base_model_name_or_path.clear();
  // A: make_synthetic_adapter's uniform / sqrt(in) (PEFT's kaiming-uniform init); B replaced below.
  LoraAdapter adapter = make_synthetic_adapter(specs.front(), config, options.seed);

  RandomLora result;
  result.mean_b_sigma.assign(kNumLoraTargets, 0.0);
  // FNV-1a of the name: distinct adapters draw distinct B at the same seed.
  uint64_t name_hash = 0xcbf29ce484222325ull;
  for (char ch : options.name) name_hash = (name_hash ^ static_cast<uint8_t>(ch)) * 0x100000001b3ull;
  for (int layer = 0; layer < config.num_layers; ++layer) {
    for (int t = 0; t < kNumLoraTargets; ++t) {
      auto& module = adapter.layers[layer][t];
      if (!module) continue;
      const int64_t out = module->b.shape[0];
      const int64_t rank = module->rank;
      double sigma = options.b_sigma;
      if (!(sigma > 0.0))
        sigma = options.relative_norm * frobenius_norm(config, weights, layer, t) * std::sqrt(3.0) /
                (module->scale * std::sqrt(static_cast<double>(out * rank)));
      result.mean_b_sigma[t] += sigma / config.num_layers;
      Prng prng(options.seed ^ name_hash ^ (0x9e3779b97f4a7c15ull * (layer * kNumLoraTargets + t + 1)));
      std::vector<float> values(out * rank);
      for (size_t i = 0; i < values.size(); i += 2) {  // Box-Muller, two normals per pair of uniforms
        const double u1 = 1.0 - prng.next_unit_float();  // (0, 1]
        const double u2 = prng.next_unit_float();
        const double radius = sigma * std::sqrt(-2.0 * std::log(u1));
        values[i] = static_cast<float>(radius * std::cos(2.0 * std::numbers::pi * u2));
        if (i + 1 < values.size()) values[i + 1] = static_cast<float>(radius * std::sin(2.0 * std::numbers::pi * u2));
      }
      module->b = Tensor::from_vector({out, rank}, std::move(values));
    }
  }
  result.adapter = std::make_shared<const LoraAdapter>(std::move(adapter));
  return result;
}

}  // namespace loom
