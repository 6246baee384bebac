// `loom divergence`: how far the KV sharing modes move an adapter's outputs
// from its isolated (exact) run: per-layer hidden-state cosine, logit KL and
// greedy agreement (tools/divergence.h has the definitions), for random LoRA
// adapters of a chosen scale or real ones (--lora), on the CPU or CUDA backend
// (--device; `--model random:llama-8b` for the 8B shape on the GPU).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "cli/device_backend.h"
#include "model/loader.h"
#include "tokenizer/tokenizer.h"
#include "tools/divergence.h"
#include "util/error.h"

namespace loom::cli {
namespace {

// A shared context of the MapReduce kind (one document, several agents).
constexpr const char* kDefaultContext =
    "Incident report INC-2291. On Tuesday at 09:14 UTC the checkout service of the online store began returning "
    "errors for about one request in six. The on-call engineer, Priya, saw the error rate alarm and opened the "
    "dashboard: latency of the payment gateway calls had risen from 120 milliseconds to almost two seconds, and "
    "the connection pool of the gateway client was exhausted. At 09:31 she rolled back the release deployed the "
    "evening before, version 4.18.2, which had changed the retry policy of the gateway client from three retries "
    "with exponential backoff to five retries without backoff. The rollback finished at 09:40, but the error rate "
    "fell only slowly, because clients kept retrying failed orders. At 09:52 the team raised the pool size from "
    "64 to 128 connections on every instance, and by 10:05 the error rate was back under 0.1 percent. About "
    "3,400 orders failed during the incident; 2,100 of them were retried successfully by customers within an "
    "hour, and support contacted the remaining customers by email with a discount code. The root cause was the "
    "retry change: under a small slowdown of the payment provider, each failed call was retried immediately five "
    "times, multiplying the load on the provider and holding pool connections for the whole retry sequence. The "
    "review found three contributing factors: the change was not load tested, the pool size alarm was missing, "
    "and the dashboard did not show retries per request. Action items: restore backoff with jitter, add a retry "
    "budget per client, alert when the pool is more than 80 percent busy, and add a load test of the gateway "
    "client to the release checklist. Owners and due dates are listed in the appendix.";

// Each agent's own instruction after the shared context.
const std::vector<std::string> kDefaultSuffixes = {
    "\n\nQuestion: In two short, clear sentences, what was the root cause of this checkout incident, and which "
    "change in the release introduced it? Answer:",
    "\n\nTask: Write a short status update for the customer support team that explains what happened to the "
    "failed orders and what affected customers should do now. Update:",
    "\n\nTask: List the action items from the report above as a numbered list, each with a one-line reason why "
    "it helps prevent this. List:",
    "\n\nQuestion: How long did the whole incident last, from the very first errors to full recovery, and how many orders "
    "failed during that time? Answer:",
    "\n\nTask: Summarize the incident in one tweet-length message for the engineering channel, without any "
    "customer data, names or any order numbers. Message:",
    "\n\nQuestion: Why did the error rate fall only slowly after the rollback had finished at 09:40? Explain it "
    "briefly. Answer:",
    "\n\nTask: Suggest a clear title for the postmortem document and three keywords to file it under, so that "
    "other teams find it later. Title:",
    "\n\nQuestion: Which monitoring gaps did the incident review find, and which single new alert would have caught "
    "the problem earliest of all, and why? Answer:",
};

struct DivergenceCommandOptions {
  std::string model;
  std::string device = "cpu";
  std::vector<std::string> loras;
  int num_adapters = 4;
  int rank = 16;
  float alpha = 32.0f;
  float relative_norm = 0.1f;
  float b_sigma = 0.0f;
  uint64_t seed = 0;
  int context_tokens = 256;
  int suffix_tokens = 32;
  int num_generated = 32;
  int prompts_per_adapter = 1;
  std::string context_file;
  std::vector<std::string> suffixes;
  std::vector<std::string> modes = {"base-model", "base", "forked", "activated"};
  std::vector<std::string> writers = {"base-model", "adapter", "self"};
  int block_size = 16;
  int threads = 0;
  bool json = false;
  std::string out;
};

struct LabeledCase {
  DivergenceCase c;
  std::string writer;  // "" unless forked: base-model, self, or the writer adapter's name
  std::string label() const {
    std::string mode = divergence_mode_name(c.mode);
    return c.mode == DivergenceMode::kForked ? mode + "/" + forked_writer_name(c.writer) : mode;
  }
};

nlohmann::json stats_json(const DivergenceStats& s) {
  return {{"layer_cosine", s.layer_cosine},
          {"min_layer_cosine", *std::min_element(s.layer_cosine.begin(), s.layer_cosine.end())},
          {"mean_kl", s.mean_kl},
          {"max_kl", s.max_kl},
          {"num_positions", s.num_positions},
          {"num_generated_tokens", s.num_generated_tokens},
          {"teacher_forced_agreement", s.teacher_forced_agreement},
          {"free_running_agreement", s.free_running_agreement},
          {"first_divergence", s.first_divergence}};
}

std::string read_text_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail(ErrorKind::kNotFound, "--context-file {}: cannot open it", path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// "after layer l" columns shown in the tables: 1, L/4, L/2, 3L/4, L.
std::vector<int> shown_layers(int num_layers) {
  std::vector<int> layers = {1, (num_layers + 2) / 4, (num_layers + 1) / 2, (3 * num_layers + 2) / 4, num_layers};
  layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
  return layers;
}

std::string table_header(const std::vector<int>& layers, const std::string& first_column) {
  std::string header = fmt::format("{:<28}", first_column);
  for (int l : layers) header += fmt::format(" {:>8}", fmt::format("cos L{}", l));
  header += fmt::format(" {:>8} {:>10} {:>10} {:>8} {:>8}", "cos min", "KL mean", "KL max", "TF agr", "FR agr");
  return header;
}

std::string table_row(const std::string& name, const DivergenceStats& s, const std::vector<int>& layers) {
  std::string row = fmt::format("{:<28}", name);
  for (int l : layers) row += fmt::format(" {:>8.5f}", s.layer_cosine[l]);
  row += fmt::format(" {:>8.5f} {:>10.3e} {:>10.3e} {:>8.3f} {:>8.3f}",
                     *std::min_element(s.layer_cosine.begin(), s.layer_cosine.end()), s.mean_kl, s.max_kl,
                     s.teacher_forced_agreement, s.free_running_agreement);
  return row;
}

int run_divergence(const DivergenceCommandOptions& options) {
  // --json owns stdout; progress and warnings go to stderr.
  if (options.json) {
    const spdlog::level::level_enum level = spdlog::get_level();
    spdlog::set_default_logger(spdlog::stderr_color_mt("loom-divergence"));
    spdlog::set_level(level);
  }
  for (int value : {options.num_adapters, options.context_tokens, options.suffix_tokens, options.num_generated,
                    options.prompts_per_adapter})
    if (value < 1) fail(ErrorKind::kInvalidArgument, "counts must be >= 1, got {}", value);
  std::vector<DivergenceMode> modes;
  for (const std::string& name : options.modes) {
    if (name == "base-model") modes.push_back(DivergenceMode::kBaseModel);
    else if (name == "base") modes.push_back(DivergenceMode::kBase);
    else if (name == "forked") modes.push_back(DivergenceMode::kForked);
    else if (name == "activated") modes.push_back(DivergenceMode::kActivated);
    else throw Error(ErrorKind::kInvalidArgument, "--modes: unknown mode '" + name + "'",
                     "use base-model, base, forked, activated");
  }
  std::vector<ForkedWriter> writers;
  for (const std::string& name : options.writers) {
    if (name == "base-model") writers.push_back(ForkedWriter::kBaseModel);
    else if (name == "adapter") writers.push_back(ForkedWriter::kAdapter);
    else if (name == "self") writers.push_back(ForkedWriter::kSelf);
    else throw Error(ErrorKind::kInvalidArgument, "--writers: unknown writer '" + name + "'",
                     "use base-model, adapter, self");
  }

  const auto start_time = std::chrono::steady_clock::now();
  ModelOnDevice loaded = load_model_on_device(options.model, DeviceOptions{options.device, options.threads, 64});
  const LoadedModel& model = loaded.model;
  std::unique_ptr<Backend> backend = std::move(loaded.backend);

  // Adapters: real ones from --lora, else random ones of the chosen scale.
  nlohmann::json adapters_json = nlohmann::json::array();
  std::vector<std::shared_ptr<const LoraAdapter>> adapters;
  if (!options.loras.empty()) {
    for (const std::string& text : options.loras) {
      const LoraSpec spec = parse_lora_spec(text);
      if (!spec.mode.empty()) spdlog::warn("--lora {}: the mode ':{}' is ignored; --modes chooses", spec.name, spec.mode);
      adapters.push_back(load_lora_adapter(spec.name, spec.path, model.config));
      adapters_json.push_back({{"name", spec.name}, {"path", spec.path}, {"max_rank", adapters.back()->max_rank()}});
    }
  } else {
    for (int i = 0; i < options.num_adapters; ++i) {
      RandomLoraOptions random;
      random.name = fmt::format("random{}", i);
      random.rank = options.rank;
      random.alpha = options.alpha;
      random.relative_norm = options.relative_norm;
      random.b_sigma = options.b_sigma;
      random.seed = options.seed + static_cast<uint64_t>(i);
      const RandomLora lora = make_random_lora(model.config, model.weights.get(), random);
      adapters.push_back(lora.adapter);
      nlohmann::json sigma;
      for (int t = 0; t < kNumLoraTargets; ++t)
        sigma[lora_target_module_name(static_cast<LoraTarget>(t))] = lora.mean_b_sigma[t];
      adapters_json.push_back({{"name", random.name}, {"rank", random.rank}, {"alpha", random.alpha},
                               {"relative_norm", options.b_sigma > 0 ? 0.0f : random.relative_norm},
                               {"seed", random.seed}, {"mean_b_sigma", sigma}});
    }
  }
  if (static_cast<int>(adapters.size()) > backend->max_adapter_slots())
    fail(ErrorKind::kInvalidArgument, "{} adapters, the backend has {} slots", adapters.size(),
         backend->max_adapter_slots());
  int32_t residual_max_rank = 1;
  for (size_t slot = 0; slot < adapters.size(); ++slot) {
    backend->set_adapter(static_cast<int32_t>(slot), adapters[slot]);
    residual_max_rank = std::max(residual_max_rank, adapters[slot]->max_rank());
  }

  // Prompts: the context cut to its first --context-tokens, each suffix to its
  // last --suffix-tokens (the instruction's cue, "Answer:", stays at the end).
  const Tokenizer& tokenizer = *model.tokenizer;
  const std::string context_text = options.context_file.empty() ? kDefaultContext : read_text_file(options.context_file);
  std::vector<int32_t> context = tokenizer.encode(context_text, true);
  if (static_cast<int>(context.size()) < options.context_tokens)
    spdlog::warn("the context has {} tokens, fewer than --context-tokens {}", context.size(), options.context_tokens);
  context.resize(std::min<size_t>(context.size(), options.context_tokens));
  const std::vector<std::string>& suffix_texts = options.suffixes.empty() ? kDefaultSuffixes : options.suffixes;
  std::vector<std::vector<int32_t>> suffixes;
  for (const std::string& text : suffix_texts) {
    std::vector<int32_t> tokens = tokenizer.encode(text, false);
    if (static_cast<int>(tokens.size()) > options.suffix_tokens)
      tokens.erase(tokens.begin(), tokens.end() - options.suffix_tokens);
    if (tokens.empty()) fail(ErrorKind::kInvalidArgument, "a suffix encodes to no tokens");
    suffixes.push_back(std::move(tokens));
  }

  DivergenceOptions measure_options;
  measure_options.num_generated_tokens = options.num_generated;
  measure_options.block_size = options.block_size;
  measure_options.residual_max_rank = residual_max_rank;

  // Per reader adapter i: its cases; the forked "adapter" writer is adapter i + 1.
  std::vector<std::string> case_labels;  // summary order
  std::map<std::string, std::vector<DivergenceStats>> by_case;
  std::map<std::pair<std::string, std::string>, std::vector<DivergenceStats>> by_adapter_case;
  nlohmann::json rows = nlohmann::json::array();
  const int num_adapters = static_cast<int>(adapters.size());
  for (int reader = 0; reader < num_adapters; ++reader) {
    std::vector<LabeledCase> cases;
    for (DivergenceMode mode : modes) {
      if (mode != DivergenceMode::kForked) {
        cases.push_back({{mode}, ""});
        continue;
      }
      for (ForkedWriter writer : writers) {
        if (writer == ForkedWriter::kAdapter) {
          if (num_adapters < 2) continue;  // no other adapter to inherit from
          const int other = (reader + 1) % num_adapters;
          cases.push_back({{mode, writer, other}, adapters[other]->name});
        } else {
          cases.push_back({{mode, writer}, forked_writer_name(writer)});
        }
      }
    }
    std::vector<DivergenceCase> plain_cases;
    for (const LabeledCase& c : cases) plain_cases.push_back(c.c);
    for (int p = 0; p < options.prompts_per_adapter; ++p) {
      const int suffix_index = (reader + p) % static_cast<int>(suffixes.size());
      const auto measure_start = std::chrono::steady_clock::now();
      const std::vector<DivergenceStats> stats = measure_divergence(
          *backend, model.config, {context, suffixes[suffix_index]}, reader, plain_cases, measure_options);
      spdlog::info("{} on suffix {}: {} cases in {:.1f} s", adapters[reader]->name, suffix_index, cases.size(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - measure_start).count());
      for (size_t i = 0; i < cases.size(); ++i) {
        const std::string label = cases[i].label();
        if (std::find(case_labels.begin(), case_labels.end(), label) == case_labels.end()) case_labels.push_back(label);
        by_case[label].push_back(stats[i]);
        by_adapter_case[{adapters[reader]->name, label}].push_back(stats[i]);
        nlohmann::json row = stats_json(stats[i]);
        row["adapter"] = adapters[reader]->name;
        row["mode"] = divergence_mode_name(cases[i].c.mode);
        row["writer"] = cases[i].writer.empty() ? nlohmann::json(nullptr) : nlohmann::json(cases[i].writer);
        row["reference"] = cases[i].c.mode == DivergenceMode::kActivated ? "isolated-masked" : "isolated";
        row["suffix"] = suffix_index;
        row["kl_by_position"] = stats[i].kl_by_position;
        row["reference_tokens"] = stats[i].reference_tokens;
        row["mode_tokens"] = stats[i].mode_tokens;
        row["reference_text"] = tokenizer.decode(stats[i].reference_tokens);
        row["mode_text"] = tokenizer.decode(stats[i].mode_tokens);
        rows.push_back(row);
      }
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_time).count();

  nlohmann::json summary = nlohmann::json::array();
  for (const std::string& label : case_labels) {
    nlohmann::json item = stats_json(average_divergence(by_case[label]));
    item["case"] = label;
    item["num_measurements"] = by_case[label].size();
    summary.push_back(item);
  }
  nlohmann::json report = {
      {"model", options.model.empty() ? model.path : options.model},
      {"num_layers", model.config.num_layers},
      {"num_context_tokens", context.size()},
      {"suffix_tokens", [&] {
         nlohmann::json sizes = nlohmann::json::array();
         for (const auto& s : suffixes) sizes.push_back(s.size());
         return sizes;
       }()},
      {"num_generated_tokens", options.num_generated},
      {"prompts_per_adapter", options.prompts_per_adapter},
      {"block_size", options.block_size},
      {"adapters", adapters_json},
      {"summary", summary},
      {"rows", rows},
      {"seconds", seconds}};
  if (!options.out.empty()) {
    std::ofstream file(options.out);
    if (!file) fail(ErrorKind::kInvalidArgument, "--out {}: cannot write it", options.out);
    file << report.dump(2) << "\n";
  }
  if (options.json) {
    std::cout << report.dump(2) << "\n";
    return 0;
  }

  const std::vector<int> layers = shown_layers(model.config.num_layers);
  std::cout << fmt::format("{} adapters, context {} tokens, suffixes {} tokens, {} generated; {:.0f} s\n",
                           num_adapters, context.size(), options.suffix_tokens, options.num_generated, seconds);
  std::cout << "cos Ll: hidden state after layer l vs the reference; KL(ref || mode) in nats; TF/FR agr: greedy "
               "agreement teacher-forced / free-running (see tools/divergence.h)\n\n";
  std::cout << "Mean over adapters and prompts\n" << table_header(layers, "case") << "\n";
  for (const std::string& label : case_labels)
    std::cout << table_row(label, average_divergence(by_case[label]), layers) << "\n";
  std::cout << "\nPer adapter (forked/adapter: the bCache of the next adapter)\n"
            << table_header(layers, "adapter case") << "\n";
  for (const auto& adapter : adapters)
    for (const std::string& label : case_labels)
      if (auto it = by_adapter_case.find({adapter->name, label}); it != by_adapter_case.end())
        std::cout << table_row(adapter->name + " " + label, average_divergence(it->second), layers) << "\n";
  std::cout << "\nPer layer: mean hidden-state cosine (layer 0 = embeddings)\n" << fmt::format("{:>5}", "layer");
  for (const std::string& label : case_labels) std::cout << fmt::format(" {:>20}", label);
  std::cout << "\n";
  for (int l = 0; l <= model.config.num_layers; ++l) {
    std::cout << fmt::format("{:>5}", l);
    for (const std::string& label : case_labels)
      std::cout << fmt::format(" {:>20.6f}", average_divergence(by_case[label]).layer_cosine[l]);
    std::cout << "\n";
  }
  return 0;
}

}  // namespace

CommandRunner register_divergence(CLI::App& app) {
  auto options = std::make_shared<DivergenceCommandOptions>();
  app.add_option("--model", options->model, "Hugging Face directory or .gguf file (default: built-in SmolLM2-135M)");
  app.add_option("--lora", options->loras, "Real adapter NAME=PATH (repeatable; replaces the random adapters)");
  app.add_option("--adapters", options->num_adapters, "Number of random adapters")->capture_default_str();
  app.add_option("--rank", options->rank, "Random adapters' rank")->capture_default_str();
  app.add_option("--alpha", options->alpha, "Random adapters' lora_alpha")->capture_default_str();
  app.add_option("--relative-norm", options->relative_norm,
                 "Random B scale: ||s B A||_F / ||W||_F per module (tools/divergence.h)")
      ->capture_default_str();
  app.add_option("--b-sigma", options->b_sigma, "Random B ~ N(0, sigma) with this fixed sigma (overrides --relative-norm)");
  app.add_option("--seed", options->seed, "Random adapters' seed")->capture_default_str();
  app.add_option("--context-tokens", options->context_tokens, "Shared context length (tokens)")->capture_default_str();
  app.add_option("--suffix-tokens", options->suffix_tokens, "Each suffix cut to its last this many tokens")->capture_default_str();
  app.add_option("--generate", options->num_generated, "Generated tokens per run (N)")->capture_default_str();
  app.add_option("--prompts-per-adapter", options->prompts_per_adapter,
                 "Suffixes per adapter (adapter i takes suffixes i, i+1, ...)")
      ->capture_default_str();
  app.add_option("--context-file", options->context_file, "Shared context text (default: a built-in incident report)");
  app.add_option("--suffix", options->suffixes, "Suffix text (repeatable; default: 8 built-in instructions)");
  app.add_option("--modes", options->modes, "Cases: base-model, base, forked, activated")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--writers", options->writers, "Forked bCache writers: base-model, adapter, self")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--block-size", options->block_size, "KV block size")->capture_default_str();
  app.add_option("--threads", options->threads, "CPU threads (0: all)");
  app.add_option("--device", options->device, "cpu, cuda or cuda:N")->capture_default_str();
  app.add_flag("--json", options->json, "Print the JSON report instead of the tables");
  app.add_option("--out", options->out, "Also write the JSON report to this file");
  return [options] { return run_divergence(*options); };
}

}  // namespace loom::cli
