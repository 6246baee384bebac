// loom_bench_forward: prefill and decode tokens/s of one backend, driven
// through the Backend interface the engine uses (no scheduler, no sampling).
//
// What one repeat measures, for a batch of B sequences, P prompt tokens and
// N decode tokens (chosen to match llama.cpp's llama-batched-bench, which is
// run side by side with this in bench/run_cpu_forward.sh):
//
//   prefill: B sequences of P random tokens from an empty cache, in one
//            forward call (or calls of --prefill-chunk tokens per sequence),
//            logits for each sequence's last token.
//            tokens/s = B * P / time
//   decode:  N forward calls, each with B one-token sequences (logits for all
//            rows). --decode-context prompt: the sequences continue after the
//            prefill (KV depth P .. P+N-1, as llama-batched-bench);
//            --decode-context empty: they start at depth 0 (as llama-bench's tg).
//   tail:    with --tail-tokens T, after the prefill: one forward call of the
//            last T prompt tokens again over the P - T before them (a warm
//            prompt whose prefix is cached recomputes such a tail).
//            time per call (and per tail token)
//            tokens/s = B * N / time
//
// After --warmup untimed repeats, --repeats timed ones; medians are reported.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "forward_breakdown.h"
#include "model/loader.h"
#include "oracles/block_allocator.h"
#include "util/error.h"

namespace loom::bench {
namespace {

struct Options {
  std::string cpu_precision = "auto";
  std::string model_path;
  std::string batch_sizes_text = "1,8";
  int num_prompt_tokens = 128;
  int num_decode_tokens = 64;
  int num_threads = 2;
  int num_repeats = 5;
  int num_warmup = 1;
  int prefill_chunk = 0;  // tokens per sequence per prefill call; 0 = whole prompt
  int tail_tokens = 0;    // > 0: also time a call of the prompt's last tail_tokens over the rest
  int block_size = 16;
  std::string decode_context = "prompt";  // "prompt" or "empty"
  unsigned seed = 1234;
  bool breakdown = false;  // also time the backend's kernels section by section
  std::string json_out;
};

std::vector<int> parse_int_list(const std::string& text) {
  std::vector<int> values;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    try {
      size_t used = 0;
      const int value = std::stoi(item, &used);
      if (used != item.size() || value <= 0) throw std::invalid_argument(item);
      values.push_back(value);
    } catch (const std::exception&) {
      fail(ErrorKind::kInvalidArgument, "--batch: '{}' is not a positive integer", item);
    }
    start = end + 1;
  }
  return values;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 ? values[middle] : 0.5 * (values[middle - 1] + values[middle]);
}

// B sequences, each with its own block table covering P + N tokens.
struct SequenceSet {
  std::vector<std::vector<int32_t>> block_tables;
};

SequenceSet allocate_sequences(BlockAllocator& allocator, int num_sequences, int num_tokens_each,
                               int block_size) {
  SequenceSet set;
  const int32_t num_blocks_each = (num_tokens_each + block_size - 1) / block_size;
  for (int s = 0; s < num_sequences; ++s) {
    auto ids = allocator.allocate(num_blocks_each);
    LOOM_CHECK(ids.has_value());  // the KV cache is sized for all sequences
    set.block_tables.push_back(std::move(*ids));
  }
  return set;
}

// One step: every sequence gets `num_new` tokens after `num_cached` cached ones.
Batch make_batch(const SequenceSet& sequences, int32_t num_cached, int32_t num_new,
                 bool logits_for_all_tokens, std::mt19937& rng, int32_t vocab_size) {
  std::uniform_int_distribution<int32_t> random_token(0, vocab_size - 1);
  Batch batch;
  for (const auto& block_table : sequences.block_tables) {
    BatchSequence sequence;
    sequence.num_computed_tokens = num_cached;
    sequence.num_new_tokens = num_new;
    sequence.token_offset = batch.num_tokens();
    sequence.block_table_offset = static_cast<int32_t>(batch.block_tables.size());
    sequence.num_blocks = static_cast<int32_t>(block_table.size());
    sequence.logits_for_all_tokens = logits_for_all_tokens;
    for (int32_t j = 0; j < num_new; ++j) {
      batch.token_ids.push_back(random_token(rng));
      batch.positions.push_back(num_cached + j);
      batch.adapter_slots.push_back(-1);
    }
    batch.block_tables.insert(batch.block_tables.end(), block_table.begin(), block_table.end());
    batch.sequences.push_back(sequence);
  }
  return batch;
}

struct RepeatTimes {
  double prefill_s = 0;
  double tail_s = 0;
  double decode_s = 0;
};

// Batches are built before the clock starts; the timed part is forward() only
// (llama.cpp's tools also build their batches outside the timed region for
// prefill, and building a B-token batch is negligible for decode).
RepeatTimes run_once(Backend& backend, const SequenceSet& sequences, const Options& options,
                     std::mt19937& rng, int32_t vocab_size) {
  RepeatTimes times;
  const int32_t num_prompt = options.num_prompt_tokens;
  const int32_t chunk = options.prefill_chunk > 0 ? options.prefill_chunk : num_prompt;
  std::vector<Batch> prefill_batches;
  for (int32_t done = 0; done < num_prompt; done += chunk)
    prefill_batches.push_back(
        make_batch(sequences, done, std::min(chunk, num_prompt - done), false, rng, vocab_size));

  auto start = std::chrono::steady_clock::now();
  for (const Batch& batch : prefill_batches) {
    ForwardResult result = backend.forward(batch);
    LOOM_CHECK(result.logit_token_index.size() == sequences.block_tables.size());
  }
  times.prefill_s = seconds_since(start);

  if (options.tail_tokens > 0) {
    const Batch tail = make_batch(sequences, num_prompt - options.tail_tokens, options.tail_tokens, false, rng,
                                  vocab_size);
    start = std::chrono::steady_clock::now();
    ForwardResult result = backend.forward(tail);
    times.tail_s = seconds_since(start);
    LOOM_CHECK(result.logit_token_index.size() == sequences.block_tables.size());
  }

  const int32_t decode_start = options.decode_context == "prompt" ? num_prompt : 0;
  double decode_s = 0;
  for (int32_t step = 0; step < options.num_decode_tokens; ++step) {
    Batch batch = make_batch(sequences, decode_start + step, 1, true, rng, vocab_size);
    start = std::chrono::steady_clock::now();
    ForwardResult result = backend.forward(batch);
    decode_s += seconds_since(start);
    LOOM_CHECK(result.logit_token_index.size() == sequences.block_tables.size());
  }
  times.decode_s = decode_s;
  return times;
}

nlohmann::json phase_json(int64_t num_tokens, const std::vector<double>& samples_s) {
  const double median_s = median(samples_s);
  return {{"num_tokens", num_tokens},
          {"median_s", median_s},
          {"tokens_per_s", num_tokens / median_s},
          {"samples_s", samples_s}};
}

// Kernel time by section for one prefill call and one decode step (mid-way
// through the decode), next to the measured forward() time of the same call.
nlohmann::json breakdown_json(const LoadedModel& model, Backend& backend, const SequenceSet& sequences,
                              const Options& options, const nlohmann::json& entry, std::mt19937& rng,
                              int32_t vocab_size) {
  const int32_t num_prompt = options.num_prompt_tokens;
  const int32_t chunk = options.prefill_chunk > 0 ? std::min(options.prefill_chunk, num_prompt) : num_prompt;
  const int num_prefill_calls = (num_prompt + chunk - 1) / chunk;
  const int32_t decode_depth =
      (options.decode_context == "prompt" ? num_prompt : 0) + options.num_decode_tokens / 2;
  const int num_sequences = static_cast<int>(sequences.block_tables.size());
  struct Call {
    const char* name;
    Batch batch;
    int num_logit_rows;
    double measured_s;
  };
  std::vector<Call> calls = {
      {"prefill_call", make_batch(sequences, 0, chunk, false, rng, vocab_size), num_sequences,
       entry["prefill"]["median_s"].get<double>() / num_prefill_calls},
      {"decode_step", make_batch(sequences, decode_depth, 1, true, rng, vocab_size), num_sequences,
       entry["decode"]["median_s"].get<double>() / options.num_decode_tokens}};
  if (options.tail_tokens > 0)
    calls.push_back({"tail_call",
                     make_batch(sequences, num_prompt - options.tail_tokens, options.tail_tokens, false, rng,
                                vocab_size),
                     num_sequences, entry["tail"]["median_s"].get<double>()});
  nlohmann::json out;
  for (const Call& call : calls) {
    // Fills the KV up to the decode depth so attention reads what it would.
    if (call.batch.sequences[0].num_computed_tokens > 0)
      backend.forward(make_batch(sequences, 0, call.batch.sequences[0].num_computed_tokens, false, rng,
                                 vocab_size));
    const auto sections = measure_forward_breakdown(model, call.batch, call.num_logit_rows,
                                                    options.block_size, options.num_threads,
                                                    options.num_repeats);
    double kernels_s = 0;
    nlohmann::json sections_json = nlohmann::json::object();
    std::printf("  %s (batch %d, %d tokens): measured forward %.2f ms\n", call.name, num_sequences,
                call.batch.num_tokens(), call.measured_s * 1e3);
    for (const auto& section : sections) {
      kernels_s += section.seconds;
      sections_json[section.name] = section.seconds;
      std::printf("    %-26s %9.2f ms  %5.1f%%\n", section.name.c_str(), section.seconds * 1e3,
                  100.0 * section.seconds / call.measured_s);
    }
    std::printf("    %-26s %9.2f ms  %5.1f%%\n", "(rest: glue, overheads)",
                (call.measured_s - kernels_s) * 1e3, 100.0 * (call.measured_s - kernels_s) / call.measured_s);
    out[call.name] = {{"num_tokens", call.batch.num_tokens()},
                      {"measured_forward_s", call.measured_s},
                      {"sections_s", sections_json},
                      {"rest_s", call.measured_s - kernels_s}};
  }
  return out;
}

int run(const Options& options) {
  if (options.decode_context != "prompt" && options.decode_context != "empty")
    fail(ErrorKind::kInvalidArgument, "--decode-context must be 'prompt' or 'empty', not '{}'",
         options.decode_context);
  const std::vector<int> batch_sizes = parse_int_list(options.batch_sizes_text);
  if (options.tail_tokens > options.num_prompt_tokens)
    fail(ErrorKind::kInvalidArgument, "--tail-tokens {} exceeds --prompt-tokens {}", options.tail_tokens,
         options.num_prompt_tokens);

  auto load_start = std::chrono::steady_clock::now();
  LoadOptions load_options;
  load_options.keep_quantized = options.cpu_precision == "auto";
  LoadedModel model = load_model(options.model_path, load_options);
  const double load_s = seconds_since(load_start);
  CpuBackendConfig backend_config;
  backend_config.num_threads = options.num_threads;
  std::unique_ptr<Backend> backend = make_cpu_backend(model.config, model.weights, backend_config);
  const int32_t vocab_size = model.config.vocab_size;
  std::printf("model %s: %d layers, hidden %d, vocab %d (loaded in %.2f s); threads %d\n",
              options.model_path.c_str(), model.config.num_layers, model.config.hidden_size,
              vocab_size, load_s, options.num_threads);
  std::printf("P=%d prompt tokens, N=%d decode tokens (decode context: %s), %d warmup + %d repeats\n",
              options.num_prompt_tokens, options.num_decode_tokens, options.decode_context.c_str(),
              options.num_warmup, options.num_repeats);
  std::printf("%6s %12s %14s %12s %14s\n", "batch", "prefill_s", "prefill_tok/s", "decode_s",
              "decode_tok/s");

  nlohmann::json results = nlohmann::json::array();
  std::mt19937 rng(options.seed);
  for (int num_sequences : batch_sizes) {
    const int num_tokens_each = options.num_prompt_tokens + options.num_decode_tokens;
    const int32_t num_blocks =
        num_sequences * ((num_tokens_each + options.block_size - 1) / options.block_size);
    backend->allocate_kv_cache({num_blocks, options.block_size});
    BlockAllocator allocator(num_blocks);
    const SequenceSet sequences =
        allocate_sequences(allocator, num_sequences, num_tokens_each, options.block_size);

    for (int i = 0; i < options.num_warmup; ++i) run_once(*backend, sequences, options, rng, vocab_size);
    std::vector<double> prefill_samples, tail_samples, decode_samples;
    for (int i = 0; i < options.num_repeats; ++i) {
      RepeatTimes times = run_once(*backend, sequences, options, rng, vocab_size);
      prefill_samples.push_back(times.prefill_s);
      tail_samples.push_back(times.tail_s);
      decode_samples.push_back(times.decode_s);
    }
    const int64_t num_prefill_tokens = int64_t{num_sequences} * options.num_prompt_tokens;
    const int64_t num_decode_tokens = int64_t{num_sequences} * options.num_decode_tokens;
    nlohmann::json entry = {{"batch", num_sequences},
                            {"prefill", phase_json(num_prefill_tokens, prefill_samples)},
                            {"decode", phase_json(num_decode_tokens, decode_samples)}};
    std::printf("%6d %12.4f %14.2f %12.4f %14.2f\n", num_sequences,
                entry["prefill"]["median_s"].get<double>(), entry["prefill"]["tokens_per_s"].get<double>(),
                entry["decode"]["median_s"].get<double>(), entry["decode"]["tokens_per_s"].get<double>());
    if (options.tail_tokens > 0) {
      entry["tail"] = phase_json(int64_t{num_sequences} * options.tail_tokens, tail_samples);
      const double tail_s = entry["tail"]["median_s"].get<double>();
      std::printf("%6s tail of %d tokens after %d: %.2f ms per call, %.2f ms per tail token\n", "",
                  options.tail_tokens, options.num_prompt_tokens - options.tail_tokens, tail_s * 1e3,
                  tail_s * 1e3 / options.tail_tokens);
    }
    std::fflush(stdout);
    if (options.breakdown)
      entry["breakdown"] = breakdown_json(model, *backend, sequences, options, entry, rng, vocab_size);
    results.push_back(std::move(entry));
  }

  if (!options.json_out.empty()) {
    nlohmann::json report = {{"engine", "loom"},
                             {"backend", "cpu"},
                             {"model", options.model_path},
                             {"threads", options.num_threads},
                             {"prompt_tokens", options.num_prompt_tokens},
                             {"decode_tokens", options.num_decode_tokens},
                             {"decode_context", options.decode_context},
                             {"prefill_chunk", options.prefill_chunk},
                             {"tail_tokens", options.tail_tokens},
                             {"block_size", options.block_size},
                             {"warmup", options.num_warmup},
                             {"repeats", options.num_repeats},
                             {"load_s", load_s},
                             {"results", results}};
    std::ofstream out(options.json_out);
    if (!out) fail(ErrorKind::kNotFound, "{}: cannot open for writing", options.json_out);
    out << report.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace loom::bench

int main(int argc, char** argv) {
  loom::bench::Options options;
  CLI::App app{"Loom forward-pass benchmark: prefill and decode tokens/s through the Backend interface"};
  app.add_option("--model", options.model_path, "Model directory or .gguf file")->required();
  app.add_option("--batch", options.batch_sizes_text, "Comma-separated batch sizes (sequences)");
  app.add_option("--prompt-tokens", options.num_prompt_tokens, "Prompt tokens per sequence")
      ->check(CLI::PositiveNumber);
  app.add_option("--decode-tokens", options.num_decode_tokens, "Decode steps per sequence")
      ->check(CLI::PositiveNumber);
  app.add_option("--cpu-precision", options.cpu_precision,
                 "auto: a GGUF's weights stay quantized (int8 kernels); fp32: expanded at load")
      ->check(CLI::IsMember({"auto", "fp32"}))
      ->capture_default_str();
  app.add_option("--threads", options.num_threads, "CPU backend threads (0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--repeats", options.num_repeats, "Timed repeats (median reported)")
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", options.num_warmup, "Untimed repeats first")->check(CLI::NonNegativeNumber);
  app.add_option("--prefill-chunk", options.prefill_chunk,
                 "Prompt tokens per sequence per prefill call (0 = all in one call)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--tail-tokens", options.tail_tokens,
                 "Also time one call of the prompt's last T tokens over the rest (a warm prefix's tail)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--block-size", options.block_size, "KV block size")->check(CLI::PositiveNumber);
  app.add_option("--decode-context", options.decode_context,
                 "'prompt': decode continues after the prefill (llama-batched-bench); "
                 "'empty': decode from depth 0 (llama-bench tg)");
  app.add_option("--seed", options.seed, "Random token seed");
  app.add_flag("--breakdown", options.breakdown,
               "Also time the CPU backend's kernels section by section (where the time goes)");
  app.add_option("--json-out", options.json_out, "Write the results as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    return loom::bench::run(options);
  } catch (const loom::Error& error) {
    std::fprintf(stderr, "loom_bench_forward: error (%s): %s\n", loom::error_kind_name(error.kind()),
                 error.what());
    return 2;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "loom_bench_forward: error: %s\n", error.what());
    return 1;
  }
}
