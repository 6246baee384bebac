// The engine's own time per decode step (issue 43: what the host adds to a GPU
// step). The engine runs the 8B shape's config and tokenizer over a backend that
// answers at once: it declares device sampling and returns each row's token
// without computing anything, so every second of a step is the engine's
// (scheduling, KV cache manager, batch building, token bookkeeping,
// detokenizing, the streams' hand-off). N streams generate G tokens each, read
// by one thread per stream as the HTTP server's handlers read them. With
// --max-running below the stream count the others wait in the scheduler, as an
// agent fan-out beyond the running cap does.
// --generate-min G0 draws each request's length from [G0, generate] so that requests end
// on different steps and nearly every step admits a waiting one. --adapters DIR loads every
// PEFT adapter under DIR (`loom make-adapters --model random:llama-8b --out DIR`) and gives
// stream s the adapter s % N: the engine's own cost of multi-LoRA batches.
//   loom_bench_engine_step [--streams 1 16 64 128] [--max-running 0] [--prompt-tokens 100] [--generate 256]
//                          [--generate-min 0] [--adapters DIR] [--out FILE]
// Prints, per stream count, the engine's steps a second and milliseconds a step:
// the least a served step costs beside the GPU's own time, where the two do not overlap.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "cli/device_backend.h"
#include "engine/engine.h"
#include "util/prng.h"

namespace loom {
namespace {

// Answers every step at once: a token per row (device sampling), no logits.
class InstantBackend final : public Backend {
 public:
  InstantBackend(const ModelConfig& config, std::atomic<int64_t>& steps) : config_(config), steps_(steps) {}
  void allocate_kv_cache(const KvCacheShape& shape) override { shape_ = shape; }
  KvCacheShape kv_cache_shape() const override { return shape_; }
  int64_t kv_bytes_per_token() const override {
    return int64_t{2} * 2 * config_.num_layers * config_.kv_size();  // bf16 K and V
  }
  void set_adapter(int32_t, std::shared_ptr<const LoraAdapter>) override {}
  int32_t max_adapter_slots() const override { return 64; }
  BackendCapabilities capabilities() const override {
    BackendCapabilities capabilities;
    capabilities.name = "instant";
    capabilities.kv_sharing_modes = all_kv_sharing_modes();
    capabilities.head_dims = {config_.head_dim};
    capabilities.device_sampling = true;
    capabilities.host_cores_idle = true;
    return capabilities;
  }
  ForwardResult forward(const Batch& batch) override {
    ++steps_;
    ForwardResult result;
    result.vocab_size = config_.vocab_size;
    for (const BatchSequence& sequence : batch.sequences) {
      const int32_t last = sequence.token_offset + sequence.num_new_tokens - 1;
      result.logit_token_index.push_back(last);
      // An ordinary word's id, never EOS: the requests run to max_new_tokens.
      result.sampled_token_ids.push_back(1000 + (batch.positions[static_cast<size_t>(last)] * 7919) % 20000);
      result.sampled_logprobs.push_back(-1.0f);
    }
    return result;
  }

 private:
  const ModelConfig config_;
  std::atomic<int64_t>& steps_;
  KvCacheShape shape_;
};

struct Figure {
  int streams = 0, max_running = 0;
  int64_t steps = 0;
  double seconds = 0, steps_per_second = 0, ms_per_step = 0, tokens_per_second = 0;
};

// The adapter directories under `directory` (each holds adapter_config.json), sorted by name.
std::vector<std::filesystem::path> adapter_directories(const std::string& directory) {
  std::vector<std::filesystem::path> found;
  if (directory.empty()) return found;
  for (const auto& entry : std::filesystem::directory_iterator(directory))
    if (std::filesystem::exists(entry.path() / "adapter_config.json")) found.push_back(entry.path());
  std::sort(found.begin(), found.end());
  if (found.empty()) throw std::runtime_error("--adapters " + directory + ": no adapter directory in it");
  return found;
}

Figure run_streams(int streams, int max_running, int prompt_tokens, int generate, int generate_min,
                   const std::vector<std::filesystem::path>& adapters) {
  LoadedModel model = cli::load_model_description("random:llama-8b");  // config and tokenizer, no weights
  const ModelConfig config = model.config;
  EngineConfig engine_config;
  engine_config.kv_cache_bytes = int64_t{16} << 30;  // accounting only: the backend holds nothing
  engine_config.max_running_requests = max_running > 0 ? max_running : std::max(streams, 1);
  engine_config.max_waiting_requests = std::max(streams, engine_config.max_waiting_requests);
  std::atomic<int64_t> steps{0};
  engine_config.max_loras_per_batch =
      std::max(engine_config.max_loras_per_batch, static_cast<int32_t>(adapters.size()));
  std::unique_ptr<Engine> engine =
      make_engine(std::move(model), std::make_unique<InstantBackend>(config, steps), engine_config);
  std::vector<std::string> adapter_names;
  for (const std::filesystem::path& path : adapters) {
    adapter_names.push_back(path.filename().string());
    engine->load_adapter(adapter_names.back(), path.string());
  }
  Prng prng(static_cast<uint64_t>(streams));
  std::vector<std::unique_ptr<RequestStream>> outputs;
  std::vector<EngineRequest> requests;
  for (int s = 0; s < streams; ++s) {
    EngineRequest request;
    for (int t = 0; t < prompt_tokens; ++t)
      request.prompt_tokens.push_back(static_cast<TokenId>(1000 + prng.next_below(20000)));
    request.max_new_tokens =
        generate_min > 0 && generate_min < generate
            ? generate_min + static_cast<int32_t>(prng.next_below(static_cast<uint64_t>(generate - generate_min + 1)))
            : generate;
    request.ignore_eos = true;
    if (!adapter_names.empty()) request.adapter = adapter_names[static_cast<size_t>(s) % adapter_names.size()];
    requests.push_back(std::move(request));
  }
  const auto start = std::chrono::steady_clock::now();
  for (EngineRequest& request : requests) outputs.push_back(engine->submit(std::move(request)));
  std::vector<std::thread> readers;
  std::vector<int64_t> tokens(streams, 0);
  for (int s = 0; s < streams; ++s) {
    readers.emplace_back([&, s] {
      while (auto output = outputs[s]->next(std::chrono::milliseconds(60000))) {
        tokens[s] += static_cast<int64_t>(output->new_tokens.size());
        if (output->finished) break;
      }
    });
  }
  for (std::thread& reader : readers) reader.join();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int64_t total = 0;
  for (int64_t count : tokens) total += count;
  Figure figure;
  figure.streams = streams;
  figure.max_running = engine_config.max_running_requests;
  figure.steps = steps.load();
  figure.seconds = seconds;
  figure.steps_per_second = static_cast<double>(figure.steps) / seconds;
  figure.ms_per_step = 1e3 * seconds / static_cast<double>(figure.steps);
  figure.tokens_per_second = static_cast<double>(total) / seconds;
  return figure;
}

int run(int argc, char** argv) {
  CLI::App app{"The engine's own time per decode step, over a backend that answers at once"};
  std::vector<int> streams = {1, 16, 64, 128};
  int prompt_tokens = 100, generate = 256, max_running = 0, generate_min = 0;
  std::string out_path, adapter_directory;
  app.add_option("--streams", streams, "Concurrent requests (one figure each)");
  app.add_option("--adapters", adapter_directory,
                 "Load the PEFT adapters under this directory, stream s using the s % N-th");
  app.add_option("--max-running", max_running, "Running requests at most (0: all the streams)")->capture_default_str();
  app.add_option("--prompt-tokens", prompt_tokens, "Prompt tokens per request")->capture_default_str();
  app.add_option("--generate", generate, "Tokens generated per request")->capture_default_str();
  app.add_option("--generate-min", generate_min, "Draw each request's length from [this, --generate] (0: all equal)")
      ->capture_default_str();
  app.add_option("--out", out_path, "JSON results");
  CLI11_PARSE(app, argc, argv);
  const std::vector<std::filesystem::path> adapters = adapter_directories(adapter_directory);
  nlohmann::json results;
  results["settings"] = {{"prompt_tokens", prompt_tokens}, {"generate", generate}, {"generate_min", generate_min},
                         {"max_running", max_running}, {"adapters", adapters.size()},
                         {"cores", std::thread::hardware_concurrency()}};
  std::printf("%8s %12s %10s %12s %12s %14s\n", "streams", "max running", "steps", "steps/s", "ms/step", "tokens/s");
  for (int count : streams) {
    const Figure figure = run_streams(count, max_running, prompt_tokens, generate, generate_min, adapters);
    std::printf("%8d %12d %10lld %12.1f %12.3f %14.0f\n", figure.streams, figure.max_running,
                static_cast<long long>(figure.steps), figure.steps_per_second, figure.ms_per_step,
                figure.tokens_per_second);
    std::fflush(stdout);
    results["streams"][std::to_string(count)] = {{"seconds", figure.seconds}, {"max_running", figure.max_running},
                                                  {"steps", figure.steps},
                                                  {"steps_per_second", figure.steps_per_second},
                                                  {"ms_per_step", figure.ms_per_step},
                                                  {"tokens_per_second", figure.tokens_per_second}};
  }
  if (!out_path.empty()) std::ofstream(out_path) << results.dump(1) << "\n";
  return 0;
}

}  // namespace
}  // namespace loom

int main(int argc, char** argv) {
  try {
    return loom::run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "loom_bench_engine_step: %s\n", error.what());
    return 1;
  }
}
