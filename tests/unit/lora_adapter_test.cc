// PEFT adapter loading and writing: round trip, PEFT's matching rules, and
// every kind of bad adapter.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "lora/adapter.h"
#include "lora/adapter_config.h"
#include "lora/peft_matching.h"
#include "synthetic/synthetic_model.h"
#include "test_util.h"
#include "util/error.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

ModelConfig tiny_llama() { return synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny); }

SyntheticAdapterSpec recipe(int index, int rank = 8) {
  SyntheticModelOptions options;
  options.num_adapters = index + 1;
  options.rank = rank;
  return synthetic_adapter_specs(options, tiny_llama()).at(index);
}

// Writes `spec` for `base` into dir and returns the directory.
std::string write_adapter(const TempDir& dir, const SyntheticAdapterSpec& spec, const ModelConfig& base) {
  const std::string path = (dir.path() / spec.name).string();
  write_lora_adapter(path, make_synthetic_adapter(spec, base, 7), base);
  return path;
}

nlohmann::ordered_json read_json(const std::string& path) {
  std::ifstream stream(path);
  return nlohmann::ordered_json::parse(stream);
}

// Replaces a safetensors file whose tensors may still be mapped: a new inode,
// so the old mapping stays valid.
void replace_safetensors(const std::string& path, const TensorMap& tensors) {
  write_safetensors(path + ".tmp", tensors);
  fs::rename(path + ".tmp", path);
}

void write_json(const std::string& path, const nlohmann::ordered_json& json) { std::ofstream(path) << json.dump(2); }

// Runs `body`, expects a loom::Error of `kind` whose text contains every `needle`.
template <typename Body>
void expect_error(Body body, ErrorKind kind, std::initializer_list<std::string> needles) {
  try {
    body();
    ADD_FAILURE() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), kind) << error.what();
    for (const std::string& needle : needles) EXPECT_NE(std::string(error.what()).find(needle), std::string::npos)
        << "'" << needle << "' not in: " << error.what();
  }
}

LoraConfig config_from(const std::string& text) {
  return parse_lora_config(nlohmann::ordered_json::parse(text), "adapter_config.json");
}

std::vector<std::string> targeted_paths(const LoraConfig& config, const ModelConfig& base) {
  std::vector<std::string> paths;
  LoraAdapterPlan plan = plan_lora_modules(config, base, "test");
  for (int layer = 0; layer < base.num_layers; ++layer)
    for (int t = 0; t < kNumLoraTargets; ++t)
      if (plan[layer][t]) paths.push_back(lora_module_path(layer, static_cast<LoraTarget>(t)));
  return paths;
}

TEST(LoraAdapter, RoundTripKeepsWeightsAndScales) {
  TempDir dir;
  const ModelConfig base = tiny_llama();
  const SyntheticAdapterSpec spec = recipe(0);
  const LoraAdapter written = make_synthetic_adapter(spec, base, 7);
  const std::string path = (dir.path() / "a").string();
  write_lora_adapter(path, written, base);

  auto loaded = load_lora_adapter("mine", path, base);
  EXPECT_EQ(loaded->name, "mine");
  EXPECT_EQ(loaded->path, path);
  EXPECT_EQ(loaded->max_rank(), 8);
  ASSERT_EQ(loaded->layers.size(), 2u);
  for (int layer = 0; layer < 2; ++layer) {
    for (int t = 0; t < kNumLoraTargets; ++t) {
      const auto& expected = written.layers[layer][t];
      const auto& actual = loaded->layers[layer][t];
      ASSERT_TRUE(expected && actual);
      EXPECT_EQ(actual->rank, 8);
      EXPECT_FLOAT_EQ(actual->scale, 16.0f / 8.0f);
      ASSERT_EQ(actual->a.shape, expected->a.shape);
      ASSERT_EQ(actual->b.shape, expected->b.shape);
      for (int64_t i = 0; i < expected->a.numel(); ++i) ASSERT_EQ(actual->a.data[i], expected->a.data[i]);
      for (int64_t i = 0; i < expected->b.numel(); ++i) ASSERT_EQ(actual->b.data[i], expected->b.data[i]);
    }
  }
  // A is [r, in], B is [out, r] (k_proj: out = kv heads * head_dim = 32).
  EXPECT_EQ(loaded->layers[0][static_cast<int>(LoraTarget::kK)]->b.shape, (std::vector<int64_t>{32, 8}));
  EXPECT_EQ(loaded->layers[1][static_cast<int>(LoraTarget::kDown)]->a.shape, (std::vector<int64_t>{8, 128}));

  // What PEFT needs to see in the files.
  const auto json = read_json(path + "/adapter_config.json");
  EXPECT_EQ(json["peft_type"], "LORA");
  EXPECT_EQ(json["task_type"], "CAUSAL_LM");
  EXPECT_EQ(json["r"], 8);
  EXPECT_EQ(json["lora_alpha"], 16);
  EXPECT_EQ(json["bias"], "none");
  EXPECT_EQ(json["target_modules"].size(), 7u);
  const TensorMap tensors = read_safetensors(path + "/adapter_model.safetensors");
  EXPECT_EQ(tensors.size(), 2u * 7u * 2u);
  EXPECT_TRUE(tensors.count("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
}

TEST(LoraAdapter, RankAndAlphaPatternsWithRsLora) {
  TempDir dir;
  const ModelConfig base = tiny_llama();
  auto adapter = load_lora_adapter("a2", write_adapter(dir, recipe(2), base), base);
  auto module = [&](int layer, LoraTarget target) { return adapter->layers[layer][static_cast<int>(target)]; };
  // rank_pattern {"o_proj": 16, "layers.0.mlp.down_proj": 4}, alpha_pattern {"k_proj": 32, "up_proj": 8}.
  EXPECT_EQ(module(0, LoraTarget::kO)->rank, 16);
  EXPECT_FLOAT_EQ(module(0, LoraTarget::kO)->scale, 16.0f / 4.0f);  // alpha / sqrt(16)
  EXPECT_EQ(module(0, LoraTarget::kDown)->rank, 4);
  EXPECT_FLOAT_EQ(module(0, LoraTarget::kDown)->scale, 16.0f / 2.0f);
  EXPECT_EQ(module(1, LoraTarget::kDown)->rank, 8);  // "layers.0" does not match layer 1
  EXPECT_FLOAT_EQ(module(1, LoraTarget::kK)->scale, static_cast<float>(32.0 / std::sqrt(8.0)));
  EXPECT_FLOAT_EQ(module(1, LoraTarget::kUp)->scale, static_cast<float>(8.0 / std::sqrt(8.0)));
  EXPECT_FALSE(module(0, LoraTarget::kV));
  EXPECT_FALSE(module(1, LoraTarget::kGate));
  EXPECT_EQ(adapter->max_rank(), 16);
}

TEST(LoraAdapter, RegexTargetsUseFullmatch) {
  TempDir dir;
  const ModelConfig base = tiny_llama();
  const SyntheticAdapterSpec spec = recipe(3);
  ASSERT_FALSE(spec.config.target_modules_regex.empty());
  auto adapter = load_lora_adapter("a3", write_adapter(dir, spec, base), base);
  EXPECT_EQ(targeted_paths(adapter->config, base),
            (std::vector<std::string>{"model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.o_proj",
                                      "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"}));
  EXPECT_EQ(read_json(adapter->path + "/adapter_config.json")["target_modules"], spec.config.target_modules_regex);
  // fullmatch, not search: a pattern for the module name alone matches nothing.
  expect_error([&] { plan_lora_modules(config_from(R"({"target_modules": "q_proj"})"), base, "x.json"); },
               ErrorKind::kFormat, {"x.json", "match no module"});
  EXPECT_EQ(targeted_paths(config_from(R"({"target_modules": ".*\\.1\\..*q_proj"})"), base),
            std::vector<std::string>{"model.layers.1.self_attn.q_proj"});
}

TEST(LoraAdapter, ListTargetsMatchPathEndings) {
  const ModelConfig base = tiny_llama();
  EXPECT_EQ(targeted_paths(config_from(R"({"target_modules": ["self_attn.v_proj", "model.layers.1.mlp.up_proj"]})"),
                           base),
            (std::vector<std::string>{"model.layers.0.self_attn.v_proj", "model.layers.1.self_attn.v_proj",
                                      "model.layers.1.mlp.up_proj"}));
  // "proj" is not a whole path segment of any module.
  EXPECT_THROW(plan_lora_modules(config_from(R"({"target_modules": ["proj"]})"), base, "t"), Error);
  // Defaults: null -> q_proj, v_proj; "all-linear" -> the seven projections.
  EXPECT_EQ(targeted_paths(config_from(R"({"target_modules": null})"), base).size(), 4u);
  EXPECT_EQ(targeted_paths(config_from(R"({"target_modules": "all-linear"})"), base).size(), 14u);
  // layers_to_transform and exclude_modules.
  EXPECT_EQ(targeted_paths(config_from(R"({"target_modules": ["q_proj", "o_proj"], "layers_to_transform": [1]})"),
                           base),
            (std::vector<std::string>{"model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.o_proj"}));
  EXPECT_EQ(targeted_paths(config_from(R"({"target_modules": ["q_proj"], "layers_to_transform": 0,
                                          "layers_pattern": "layers"})"),
                           base),
            std::vector<std::string>{"model.layers.0.self_attn.q_proj"});
  EXPECT_EQ(targeted_paths(config_from(R"({"target_modules": "all-linear",
                                          "exclude_modules": ["mlp.gate_proj", "up_proj", "down_proj", "k_proj"]})"),
                           base)
                .size(),
            6u);
  EXPECT_EQ(targeted_paths(config_from(R"({"target_modules": ["q_proj"], "exclude_modules": ".*\\.0\\..*"})"), base),
            std::vector<std::string>{"model.layers.1.self_attn.q_proj"});
}

TEST(LoraAdapter, PatternKeysTriedInFileOrder) {
  const ModelConfig base = tiny_llama();
  // PEFT's get_pattern_key returns the first key (in file order) that matches the path's end.
  const LoraConfig first_generic = config_from(
      R"({"r": 8, "target_modules": ["q_proj"], "rank_pattern": {"q_proj": 4, "layers.0.self_attn.q_proj": 2}})");
  const LoraConfig first_specific = config_from(
      R"({"r": 8, "target_modules": ["q_proj"], "rank_pattern": {"layers.0.self_attn.q_proj": 2, "q_proj": 4}})");
  const int q = static_cast<int>(LoraTarget::kQ);
  EXPECT_EQ(plan_lora_modules(first_generic, base, "t")[0][q]->rank, 4);
  EXPECT_EQ(plan_lora_modules(first_specific, base, "t")[0][q]->rank, 2);
  EXPECT_EQ(plan_lora_modules(first_specific, base, "t")[1][q]->rank, 4);
  // Keys are regexes anchored at a '.' boundary: "_proj" does not match "q_proj", ".*_proj" does.
  const LoraConfig regex_keys = config_from(
      R"({"r": 8, "lora_alpha": 8, "target_modules": ["q_proj"], "alpha_pattern": {"_proj": 1, ".*_proj": 32}})");
  EXPECT_FLOAT_EQ(plan_lora_modules(regex_keys, base, "t")[0][q]->scale, 4.0f);
  // The order survives a write and a parse.
  const LoraConfig reparsed = parse_lora_config(lora_config_to_json(first_specific), "again");
  EXPECT_EQ(reparsed.rank_pattern_order, (std::vector<std::string>{"layers.0.self_attn.q_proj", "q_proj"}));
}

TEST(LoraAdapter, ParsesAloraAndLoomFields) {
  const LoraConfig config = config_from(R"({"r": 4, "lora_alpha": 12.5, "use_rslora": true,
      "alora_invocation_tokens": [5, 6, 7], "base_model_name_or_path": "org/base", "loom_kv_sharing": "base",
      "lora_dropout": 0.1, "init_lora_weights": "gaussian", "some_future_field": 1})");
  EXPECT_EQ(config.rank, 4);
  EXPECT_FLOAT_EQ(config.alpha, 12.5f);
  EXPECT_TRUE(config.use_rslora);
  EXPECT_EQ(config.alora_invocation_tokens, (std::vector<int>{5, 6, 7}));
  EXPECT_EQ(config.base_model_name_or_path, "org/base");
  EXPECT_EQ(config.loom_kv_sharing, "base");
  const auto json = lora_config_to_json(config);
  EXPECT_EQ(json["alora_invocation_tokens"], nlohmann::ordered_json({5, 6, 7}));
  EXPECT_EQ(json["loom_kv_sharing"], "base");
  EXPECT_DOUBLE_EQ(json["lora_alpha"].get<double>(), 12.5);
  expect_error([] { config_from(R"({"loom_kv_sharing": "shared"})"); }, ErrorKind::kFormat, {"loom_kv_sharing"});
  expect_error([] { config_from(R"({"r": "eight"})"); }, ErrorKind::kFormat, {"adapter_config.json", "'r'"});
}

TEST(LoraAdapter, RejectsUnsupportedConfigsWithHints) {
  const ModelConfig base = tiny_llama();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"use_dora": true})", "DoRA"},
      {R"({"bias": "lora_only"})", "bias"},
      {R"({"lora_bias": true})", "lora_bias"},
      {R"({"modules_to_save": ["lm_head"]})", "modules_to_save"},
      {R"({"target_parameters": ["mlp.experts.down_proj"]})", "target_parameters"},
      {R"({"trainable_token_indices": [1, 2]})", "trainable_token_indices"},
      {R"({"layer_replication": [[0, 2]]})", "layer_replication"},
      {R"({"peft_type": "IA3"})", "IA3"},
      {R"({"velora_config": {"rank": 2}})", "velora_config"},
  };
  for (const auto& [text, needle] : cases) {
    SCOPED_TRACE(text);
    try {
      config_from(text);
      ADD_FAILURE() << "accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::kUnsupported);
      EXPECT_NE(error.message().find(needle), std::string::npos) << error.message();
      EXPECT_FALSE(error.hint().empty());
    }
  }
  // Targets that are not projections: embeddings, lm_head, norms.
  for (const char* text : {R"({"target_modules": ["embed_tokens"]})", R"({"target_modules": ["q_proj", "lm_head"]})",
                           R"j({"target_modules": ".*(norm|q_proj)"})j"}) {
    SCOPED_TRACE(text);
    expect_error([&] { plan_lora_modules(config_from(text), base, "cfg.json"); }, ErrorKind::kUnsupported,
                 {"cfg.json"});
  }
  // Options that only shape training are accepted.
  EXPECT_NO_THROW(config_from(R"({"use_dora": false, "bias": "none", "modules_to_save": null, "fan_in_fan_out": false,
                                  "loftq_config": {}, "megatron_core": "megatron.core", "use_qalora": false})"));
}

TEST(LoraAdapter, MissingFilesAndTensors) {
  TempDir dir;
  const ModelConfig base = tiny_llama();
  expect_error([&] { load_lora_adapter("x", (dir.path() / "nope").string(), base); }, ErrorKind::kNotFound, {"nope"});
  fs::create_directories(dir.path() / "empty");
  expect_error([&] { load_lora_adapter("x", (dir.path() / "empty").string(), base); }, ErrorKind::kNotFound,
               {"adapter_config.json"});

  const std::string path = write_adapter(dir, recipe(1), base);
  std::ofstream(path + "/adapter_config.json") << "{ not json";
  expect_error([&] { load_lora_adapter("x", path, base); }, ErrorKind::kFormat, {"adapter_config.json", "malformed"});

  const std::string path2 = write_adapter(dir, recipe(0), base);
  fs::remove(path2 + "/adapter_model.safetensors");
  expect_error([&] { load_lora_adapter("x", path2, base); }, ErrorKind::kNotFound, {"adapter_model.safetensors"});
  std::ofstream(path2 + "/adapter_model.bin") << "pickle";
  expect_error([&] { load_lora_adapter("x", path2, base); }, ErrorKind::kUnsupported, {"adapter_model.bin"});

  // Drop one tensor: the error names it.
  const std::string path3 = write_adapter(dir, recipe(1), base);
  TensorMap tensors = read_safetensors(path3 + "/adapter_model.safetensors");
  tensors.erase("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight");
  replace_safetensors(path3 + "/adapter_model.safetensors", tensors);
  expect_error([&] { load_lora_adapter("x", path3, base); }, ErrorKind::kNotFound,
               {"adapter_model.safetensors", "model.layers.1.self_attn.v_proj.lora_B"});
}

TEST(LoraAdapter, AdapterForAnotherBaseModelIsAClearError) {
  TempDir dir;
  const ModelConfig llama = tiny_llama();
  SyntheticModelOptions options;
  options.num_adapters = 1;
  options.targets = {"q_proj"};
  const SyntheticAdapterSpec spec = synthetic_adapter_specs(options, llama)[0];

  ModelConfig wider = llama;  // another hidden size: A is [8, 96]
  wider.hidden_size = 96;
  const std::string path = write_adapter(dir, spec, wider);
  expect_error([&] { load_lora_adapter("x", path, llama); }, ErrorKind::kFormat,
               {"adapter_model.safetensors", "q_proj.lora_A.weight", "[8, 96]", "[8, 64]", "another base model"});

  ModelConfig deeper = llama;  // same widths, one more layer
  deeper.num_layers = 3;
  SyntheticAdapterSpec deeper_spec = spec;
  deeper_spec.name = "deeper";
  const std::string path2 = write_adapter(dir, deeper_spec, deeper);
  expect_error([&] { load_lora_adapter("x", path2, llama); }, ErrorKind::kFormat,
               {"model.layers.2.self_attn.q_proj", "2 layers", "another base model"});
}

TEST(LoraAdapter, RankInConfigMustMatchTensors) {
  TempDir dir;
  const ModelConfig base = tiny_llama();
  const std::string path = write_adapter(dir, recipe(0), base);
  auto json = read_json(path + "/adapter_config.json");
  json["r"] = 4;
  write_json(path + "/adapter_config.json", json);
  expect_error([&] { load_lora_adapter("x", path, base); }, ErrorKind::kFormat, {"lora_A", "[8, 64]", "[4, 64]"});
}

TEST(LoraAdapter, TensorsMustMatchTheTargets) {
  TempDir dir;
  const ModelConfig base = tiny_llama();
  const std::string path = write_adapter(dir, recipe(0), base);  // all seven modules
  auto json = read_json(path + "/adapter_config.json");
  json["target_modules"] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj"};
  write_json(path + "/adapter_config.json", json);
  expect_error([&] { load_lora_adapter("x", path, base); }, ErrorKind::kFormat, {"down_proj", "does not target"});

  json["alora_invocation_tokens"] = {3, 100000};
  json["target_modules"] = "all-linear";
  write_json(path + "/adapter_config.json", json);
  expect_error([&] { load_lora_adapter("x", path, base); }, ErrorKind::kFormat, {"100000"});
}

TEST(LoraAdapter, AcceptsPeftNameVariantsAndRejectsDora) {
  TempDir dir;
  const ModelConfig base = tiny_llama();
  const std::string path = write_adapter(dir, recipe(1), base);
  const TensorMap original = read_safetensors(path + "/adapter_model.safetensors");
  // Variants: no "base_model.model." prefix, an adapter name, no ".weight".
  const std::vector<std::pair<std::string, std::string>> rewrites = {
      {"base_model.model.", ""}, {".weight", ".default.weight"}, {".weight", ""}};
  for (const auto& [from, to] : rewrites) {
    SCOPED_TRACE(from + " -> " + to);
    TensorMap renamed;
    for (const auto& [name, tensor] : original) {
      std::string new_name = name;
      new_name.replace(new_name.find(from), from.size(), to);
      renamed[new_name] = tensor;
    }
    replace_safetensors(path + "/adapter_model.safetensors", renamed);
    auto adapter = load_lora_adapter("x", path, base);
    EXPECT_EQ(adapter->layers[1][static_cast<int>(LoraTarget::kV)]->rank, 4);
    EXPECT_EQ(adapter->layers[1][static_cast<int>(LoraTarget::kV)]->a.data[5],
              original.at("base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight").data[5]);
  }
  TensorMap with_dora = original;
  with_dora["base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector"] =
      Tensor::from_vector({64}, std::vector<float>(64, 1.0f));
  replace_safetensors(path + "/adapter_model.safetensors", with_dora);
  expect_error([&] { load_lora_adapter("x", path, base); }, ErrorKind::kUnsupported, {"lora_magnitude_vector", "DoRA"});

  TensorMap with_junk = original;
  with_junk["base_model.model.lm_head.weight"] = Tensor::from_vector({2}, {1.0f, 2.0f});
  replace_safetensors(path + "/adapter_model.safetensors", with_junk);
  expect_error([&] { load_lora_adapter("x", path, base); }, ErrorKind::kFormat, {"lm_head.weight"});
}

TEST(LoraAdapter, WriterRejectsInconsistentAdapters) {
  TempDir dir;
  const ModelConfig base = tiny_llama();
  LoraAdapter adapter = make_synthetic_adapter(recipe(1), base, 3);  // q_proj, v_proj
  adapter.config.target_modules = {"q_proj"};
  expect_error([&] { write_lora_adapter((dir.path() / "w").string(), adapter, base); }, ErrorKind::kInvalidArgument,
               {"v_proj", "does not target"});
  adapter.config.target_modules = {"q_proj", "v_proj"};
  adapter.config.rank = 2;
  expect_error([&] { write_lora_adapter((dir.path() / "w").string(), adapter, base); }, ErrorKind::kInvalidArgument,
               {"q_proj"});
}

}  // namespace
}  // namespace loom
