// What FP8 costs a model's outputs (issue 40's accuracy figures on random models):
// per-token logprob drift and greedy agreement of FP8 weights (--quantization fp8),
// an FP8 KV cache (--kv-cache-dtype fp8) and both, against the same model in bf16.
//
// For each model (the tiny presets of every architecture and the 8B shape, random
// weights as `--model random:...`), S sequences of P random prompt tokens:
//   reference  bf16 weights and cache, greedy: its G tokens and their logits rows
//   teacher-forced  each FP8 configuration fed the reference's tokens (one prefill,
//              then G-1 decode steps): per generated position, |logprob of the
//              reference token under the FP8 run - under bf16|, KL(bf16 || FP8) over
//              the vocabulary, and whether the FP8 run's argmax is the reference token
//   free-running  each configuration greedy on its own: tokens equal to the
//              reference's before the first difference
//   floor      (tiny models) the CPU backend in fp32 against the same bf16
//              reference: how far bf16 itself is from exact on these models
// Random weights give flat next-token distributions (the reference's mean entropy
// and top-1 probability are reported beside the figures), so greedy agreement here
// is a harsher test than on a trained model's peaked ones.
// Writes one JSON object (--out) and prints a table. One configuration's backend
// lives at a time (the 8B shape in bf16 is 16 GB).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend_impl.h"
#include "bench_main.h"
#include "model/weights.h"
#include "synthetic/synthetic_model.h"
#include "synthetic/synthetic_weights.h"
#include "util/prng.h"

namespace loom::cuda {
namespace {

constexpr int kBlockSize = 16;

struct Variant {
  const char* name;
  bool fp8_weights;
  bool fp8_kv;
};
constexpr Variant kVariants[] = {
    {"bf16", false, false}, {"fp8_kv", false, true}, {"fp8_weights", true, false}, {"fp8_weights_fp8_kv", true, true}};

// One configuration's steps over the S sequences: the logits row of each step
// ([step][sequence * vocab]) and the tokens it fed or chose ([sequence][step]).
struct Run {
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<int32_t>> tokens;
};

int32_t argmax(const float* row, int32_t vocab) {
  return static_cast<int32_t>(std::max_element(row, row + vocab) - row);
}

// Prefill of every prompt, then decode steps; each step's token is forced[s][step]
// when `forced` is given, else the run's own argmax.
Run run_sequences(Backend& backend, const std::vector<std::vector<int32_t>>& prompts, int generated,
                  const std::vector<std::vector<int32_t>>* forced) {
  const int sequences = static_cast<int>(prompts.size());
  const int prompt_tokens = static_cast<int>(prompts[0].size());
  const int blocks_each = (prompt_tokens + generated + kBlockSize - 1) / kBlockSize;
  Run run;
  run.tokens.assign(sequences, {});
  for (int step = 0; step < generated; ++step) {
    Batch batch;
    for (int s = 0; s < sequences; ++s) {
      BatchSequence sequence;
      sequence.num_computed_tokens = step == 0 ? 0 : prompt_tokens + step - 1;
      sequence.num_new_tokens = step == 0 ? prompt_tokens : 1;
      sequence.token_offset = static_cast<int32_t>(batch.token_ids.size());
      sequence.block_table_offset = static_cast<int32_t>(batch.block_tables.size());
      sequence.num_blocks = blocks_each;
      for (int b = 0; b < blocks_each; ++b) batch.block_tables.push_back(s * blocks_each + b);
      for (int t = 0; t < sequence.num_new_tokens; ++t) {
        batch.token_ids.push_back(step == 0 ? prompts[s][t] : run.tokens[s][step - 1]);
        batch.positions.push_back(sequence.num_computed_tokens + t);
        batch.adapter_slots.push_back(-1);
      }
      batch.sequences.push_back(sequence);
    }
    ForwardResult result = backend.forward(batch);
    for (int s = 0; s < sequences; ++s) {
      const float* row = result.logits.data() + static_cast<size_t>(s) * result.vocab_size;
      run.tokens[s].push_back(forced != nullptr ? (*forced)[s][step] : argmax(row, result.vocab_size));
    }
    run.logits.push_back(std::move(result.logits));
  }
  return run;
}

std::vector<double> log_softmax(const float* row, int32_t vocab) {
  const float top = *std::max_element(row, row + vocab);
  double sum = 0;
  for (int32_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - top);
  const double log_sum = std::log(sum) + top;
  std::vector<double> out(vocab);
  for (int32_t v = 0; v < vocab; ++v) out[v] = row[v] - log_sum;
  return out;
}

nlohmann::json compare(const Run& reference, const Run& forced, const Run& free_running, int32_t vocab) {
  std::vector<double> drifts;
  double kl_sum = 0;
  int agree = 0, rows = 0;
  for (size_t step = 0; step < reference.logits.size(); ++step) {
    for (size_t s = 0; s < reference.tokens.size(); ++s) {
      const std::vector<double> p = log_softmax(reference.logits[step].data() + s * vocab, vocab);
      const float* q_row = forced.logits[step].data() + s * vocab;
      const std::vector<double> q = log_softmax(q_row, vocab);
      const int32_t token = reference.tokens[s][step];
      drifts.push_back(std::abs(p[token] - q[token]));
      double kl = 0;
      for (int32_t v = 0; v < vocab; ++v) kl += std::exp(p[v]) * (p[v] - q[v]);
      kl_sum += std::max(0.0, kl);
      agree += argmax(q_row, vocab) == token;
      ++rows;
    }
  }
  std::sort(drifts.begin(), drifts.end());
  double drift_sum = 0;
  for (double d : drifts) drift_sum += d;
  int matched_total = 0, identical = 0;
  const int generated = static_cast<int>(reference.logits.size());
  for (size_t s = 0; s < reference.tokens.size(); ++s) {
    int matched = 0;
    while (matched < generated && free_running.tokens[s][matched] == reference.tokens[s][matched]) ++matched;
    matched_total += matched;
    identical += matched == generated;
  }
  const double sequences = static_cast<double>(reference.tokens.size());
  return {{"logprob_drift_mean", drift_sum / rows},
          {"logprob_drift_p99", drifts[std::min(drifts.size() - 1, drifts.size() * 99 / 100)]},
          {"logprob_drift_max", drifts.back()},
          {"kl_mean", kl_sum / rows},
          {"greedy_agreement_teacher_forced", static_cast<double>(agree) / rows},
          {"free_running_tokens_before_first_difference", matched_total / sequences},
          {"free_running_identical_sequences", identical / sequences}};
}

// The reference's next-token distributions: mean entropy (nats) and mean top-1 probability.
nlohmann::json sharpness(const Run& reference, int32_t vocab) {
  double entropy = 0, top = 0;
  int rows = 0;
  for (const std::vector<float>& step : reference.logits) {
    for (size_t s = 0; s < reference.tokens.size(); ++s) {
      const std::vector<double> p = log_softmax(step.data() + s * vocab, vocab);
      double h = 0;
      for (double lp : p) h -= std::exp(lp) * lp;
      entropy += h;
      top += std::exp(*std::max_element(p.begin(), p.end()));
      ++rows;
    }
  }
  return {{"entropy_mean", entropy / rows}, {"top1_probability_mean", top / rows}};
}

// The tiny preset on the CPU backend in fp32 (make-model's f32 tensors).
std::unique_ptr<Backend> cpu_fp32_backend(const ModelConfig& config) {
  TensorMap tensors;
  for (const SyntheticTensorSpec& spec : synthetic_base_tensor_specs(config)) tensors[spec.name] = make_synthetic_tensor(spec, 0);
  return make_cpu_backend(config, std::make_shared<ModelWeights>(build_model_weights(config, tensors, "synthetic")));
}

void print_row(const std::string& model, const char* variant, const nlohmann::json& figures, int generated) {
  std::printf("%-14s %-20s %10.4f %10.4f %10.5f %8.3f %9.1f/%d\n", model.c_str(), variant,
              figures["logprob_drift_mean"].get<double>(), figures["logprob_drift_p99"].get<double>(),
              figures["kl_mean"].get<double>(), figures["greedy_agreement_teacher_forced"].get<double>(),
              figures["free_running_tokens_before_first_difference"].get<double>(), generated);
  std::fflush(stdout);
}

int run(int argc, char** argv) {
  CLI::App app{"FP8 weights and KV cache against bf16: logprob drift and greedy agreement on random models"};
  std::string out_path = "fp8_drift.json";
  int sequences = 8, prompt_tokens = 512, generated = 64;
  std::vector<std::string> models = {"llama-tiny", "qwen2-tiny", "qwen3-tiny", "mistral-tiny", "llama-8b"};
  app.add_option("--out", out_path, "JSON results");
  app.add_option("--sequences", sequences, "Prompts per model")->capture_default_str();
  app.add_option("--prompt-tokens", prompt_tokens, "Random prompt tokens each")->capture_default_str();
  app.add_option("--generate", generated, "Greedy tokens after each prompt")->capture_default_str();
  app.add_option("--models", models, "ARCH-PRESET names (as --model random:ARCH-PRESET)");
  CLI11_PARSE(app, argc, argv);

  nlohmann::json results;
  results["device"] = cuda_device_description(0);
  results["settings"] = {{"sequences", sequences}, {"prompt_tokens", prompt_tokens}, {"generated", generated},
                         {"fp8_weights", "e4m3, one scale a matrix (dynamic, as --quantization fp8)"},
                         {"fp8_kv", "e4m3, scales 1.0 (random weights have no checkpoint scales)"}};
  std::printf("%-14s %-20s %10s %10s %10s %8s %12s\n", "model", "variant", "|dlogp|", "p99", "KL", "TF agree",
              "FR prefix");
  for (const std::string& name : models) {
    const size_t dash = name.rfind('-');
    const Architecture arch = architecture_from_short_name(name.substr(0, dash));
    const SyntheticPreset preset = synthetic_preset_from_name(name.substr(dash + 1));
    const ModelConfig config = synthetic_model_config(arch, preset);
    Prng prng(7);
    std::vector<std::vector<int32_t>> prompts(sequences);
    for (auto& prompt : prompts)
      for (int t = 0; t < prompt_tokens; ++t) prompt.push_back(static_cast<int32_t>(prng.next_below(config.vocab_size)));
    const int blocks = sequences * ((prompt_tokens + generated + kBlockSize - 1) / kBlockSize);
    Run reference;
    for (const Variant& variant : kVariants) {
      CudaBackendConfig backend_config;
      backend_config.fp8_weights = variant.fp8_weights;
      if (variant.fp8_kv) backend_config.kv_cache_dtype = KvCacheDtype::kFp8E4M3;
      auto backend = make_synthetic_cuda_backend_impl(config, 0, preset != SyntheticPreset::kTiny, backend_config);
      backend->allocate_kv_cache({blocks, kBlockSize});
      if (!variant.fp8_weights && !variant.fp8_kv) {
        reference = run_sequences(*backend, prompts, generated, nullptr);
        results["models"][name]["bf16_reference"] = sharpness(reference, config.vocab_size);
        if (preset == SyntheticPreset::kTiny) {
          std::unique_ptr<Backend> cpu = cpu_fp32_backend(config);
          cpu->allocate_kv_cache({blocks, kBlockSize});
          const Run forced = run_sequences(*cpu, prompts, generated, &reference.tokens);
          const Run free_running = run_sequences(*cpu, prompts, generated, nullptr);
          results["models"][name]["cpu_fp32"] = compare(reference, forced, free_running, config.vocab_size);
          print_row(name, "cpu_fp32 (floor)", results["models"][name]["cpu_fp32"], generated);
        }
        continue;
      }
      const Run forced = run_sequences(*backend, prompts, generated, &reference.tokens);
      const Run free_running = run_sequences(*backend, prompts, generated, nullptr);
      results["models"][name][variant.name] = compare(reference, forced, free_running, config.vocab_size);
      print_row(name, variant.name, results["models"][name][variant.name], generated);
    }
    const nlohmann::json& sharp = results["models"][name]["bf16_reference"];
    std::printf("%-14s bf16 reference: entropy %.2f nats, top-1 probability %.3f\n", name.c_str(),
                sharp["entropy_mean"].get<double>(), sharp["top1_probability_mean"].get<double>());
  }
  std::ofstream(out_path) << results.dump(1) << "\n";
  return 0;
}

}  // namespace
}  // namespace loom::cuda

int main(int argc, char** argv) {
  return loom::cuda::bench::bench_main("loom_fp8_drift", loom::cuda::run, argc, argv);
}
