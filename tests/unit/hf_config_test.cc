// config.json parsing for Llama / Qwen2 / Qwen3 / Mistral in transformers 4 and 5
// spellings, errors, and the writer's round trip.
#include "model/hf_config.h"
#include "model/layer_spec.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>

#include <gtest/gtest.h>

#include "test_util.h"
#include "util/error.h"

namespace loom {
namespace {

using nlohmann::json;

using test::expect_error;

// Llama-3.1-8B-Instruct's config.json as published (transformers 4 spelling).
json llama31_config() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})");
}

void expect_llama31(const ModelConfig& config) {
  EXPECT_EQ(config.arch, Architecture::kLlama);
  EXPECT_EQ(config.vocab_size, 128256);
  EXPECT_EQ(config.hidden_size, 4096);
  EXPECT_EQ(config.intermediate_size, 14336);
  EXPECT_EQ(config.num_layers, 32);
  EXPECT_EQ(config.num_heads, 32);
  EXPECT_EQ(config.num_kv_heads, 8);
  EXPECT_EQ(config.head_dim, 128);
  EXPECT_EQ(config.max_position_embeddings, 131072);
  EXPECT_EQ(config.rms_norm_eps, 1e-5f);
  EXPECT_EQ(config.rope_theta, 500000.0f);
  EXPECT_EQ(config.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(config.rope_scaling.factor, 8.0f);
  EXPECT_EQ(config.rope_scaling.low_freq_factor, 1.0f);
  EXPECT_EQ(config.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(config.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_FALSE(config.tie_word_embeddings);
  EXPECT_FALSE(config.qkv_bias);
  EXPECT_FALSE(config.o_bias);
  EXPECT_FALSE(config.qk_norm);
  EXPECT_EQ(config.bos_token_id, 128000);
  EXPECT_EQ(config.eos_token_ids, (std::vector<int>{128001, 128008, 128009}));
}

TEST(HfConfigTest, Llama31WithTransformers4RopeScaling) {
  ModelConfig config = parse_hf_config(llama31_config(), "config.json");
  expect_llama31(config);
  EXPECT_EQ(config.torch_dtype, "bfloat16");
}

TEST(HfConfigTest, RopeScalingWithLegacyTypeKey) {
  json root = llama31_config();
  root["rope_scaling"].erase("rope_type");
  root["rope_scaling"]["type"] = "llama3";
  expect_llama31(parse_hf_config(root, "config.json"));
}

TEST(HfConfigTest, Transformers5RopeParameters) {
  json root = llama31_config();
  root.erase("rope_scaling");
  root.erase("rope_theta");
  root["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0},
                             {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                             {"original_max_position_embeddings", 8192}};
  expect_llama31(parse_hf_config(root, "config.json"));
}

TEST(HfConfigTest, ConfigsSavedByTransformers5) {
  // What AutoConfig.from_pretrained(...).save_pretrained(...) writes in transformers 5.17
  // (rope_parameters only; no rope_theta / rope_scaling keys).
  ModelConfig llama = read_hf_config(test::fixture_path("formats/llama3_config_saved_by_transformers5.json"));
  expect_llama31(llama);
  EXPECT_EQ(llama.torch_dtype, "float32");

  ModelConfig qwen3 = read_hf_config(test::fixture_path("formats/qwen3_config_saved_by_transformers5.json"));
  EXPECT_EQ(qwen3.arch, Architecture::kQwen3);
  EXPECT_EQ(qwen3.rope_theta, 1e6f);
  EXPECT_EQ(qwen3.rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(qwen3.head_dim, 128);
  EXPECT_EQ(qwen3.num_heads, 16);  // head_dim * heads != hidden: Qwen3 allows it
  EXPECT_TRUE(qwen3.qk_norm);
  EXPECT_TRUE(qwen3.tie_word_embeddings);
  EXPECT_EQ(qwen3.bos_token_id, -1);  // null
  EXPECT_EQ(qwen3.eos_token_ids, std::vector<int>{151645});
}

TEST(HfConfigTest, LlamaWithAttentionBiasAndExplicitHeadDim) {
  json root = llama31_config();
  root["attention_bias"] = true;
  root["head_dim"] = 64;
  root["rope_scaling"] = nullptr;
  ModelConfig config = parse_hf_config(root, "config.json");
  EXPECT_TRUE(config.qkv_bias);
  EXPECT_TRUE(config.o_bias);
  EXPECT_EQ(config.head_dim, 64);
  EXPECT_EQ(config.q_size(), 32 * 64);
  EXPECT_EQ(config.rope_scaling.type, RopeScaling::Type::kNone);
  const LayerSpec layer = layer_spec(config);
  EXPECT_TRUE(layer.qkv_bias && layer.o_bias);
  EXPECT_FALSE(layer.qk_norm);
  EXPECT_EQ(layer.head_dim, 64);
  EXPECT_EQ(layer.intermediate_size, config.intermediate_size);
}

TEST(HfConfigTest, Qwen2HasQkvBiasButNoOutputBias) {
  // Qwen2.5-0.5B-Instruct's config.json.
  json root = json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
    "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
    "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936})");
  ModelConfig config = parse_hf_config(root, "qwen/config.json");
  EXPECT_EQ(config.arch, Architecture::kQwen2);
  EXPECT_TRUE(config.qkv_bias);
  EXPECT_FALSE(config.o_bias);
  EXPECT_FALSE(config.qk_norm);
  EXPECT_EQ(config.head_dim, 64);
  EXPECT_EQ(config.sliding_window, 0);  // use_sliding_window is false
  EXPECT_TRUE(config.tie_word_embeddings);
  EXPECT_EQ(config.rms_norm_eps, 1e-6f);
  EXPECT_EQ(config.rope_theta, 1e6f);
  EXPECT_EQ(config.eos_token_ids, std::vector<int>{151645});
}

TEST(HfConfigTest, Qwen3HeadDimAndQkNorm) {
  // Qwen3-0.6B's config.json: head_dim 128 although hidden / heads = 64.
  json root = json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
    "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
  ModelConfig config = parse_hf_config(root, "config.json");
  EXPECT_EQ(config.arch, Architecture::kQwen3);
  EXPECT_EQ(config.head_dim, 128);
  EXPECT_EQ(config.q_size(), 2048);
  EXPECT_EQ(config.kv_size(), 1024);
  EXPECT_TRUE(config.qk_norm);
  EXPECT_FALSE(config.qkv_bias);
  EXPECT_FALSE(config.o_bias);
  EXPECT_EQ(config.rope_theta, 1e6f);  // an integer in JSON
  EXPECT_EQ(config.max_position_embeddings, 40960);
  // The layer the backends run: the explicit head_dim, q/k norms, no biases.
  const LayerSpec layer = layer_spec(config);
  EXPECT_EQ(layer.q_size(), 2048);
  EXPECT_EQ(layer.kv_size(), 1024);
  EXPECT_TRUE(layer.qk_norm);
  EXPECT_FALSE(layer.qkv_bias || layer.o_bias);
}

TEST(HfConfigTest, MistralSlidingWindowMayBeNull) {
  json root = json::parse(R"({
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 32768,
    "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "vocab_size": 32768})");
  ModelConfig config = parse_hf_config(root, "config.json");
  EXPECT_EQ(config.arch, Architecture::kMistral);
  EXPECT_EQ(config.sliding_window, 0);
  EXPECT_EQ(config.head_dim, 128);
  root["sliding_window"] = 4096;
  EXPECT_EQ(parse_hf_config(root, "config.json").sliding_window, 4096);
}

TEST(HfConfigTest, SpecialTokenSpellings) {
  json root = llama31_config();
  root["eos_token_id"] = 7;
  root["bos_token_id"] = nullptr;
  ModelConfig config = parse_hf_config(root, "config.json");
  EXPECT_EQ(config.eos_token_ids, std::vector<int>{7});
  EXPECT_EQ(config.bos_token_id, -1);
  root.erase("eos_token_id");
  EXPECT_TRUE(parse_hf_config(root, "config.json").eos_token_ids.empty());
}

TEST(HfConfigTest, ArchitectureNames) {
  for (Architecture arch : {Architecture::kLlama, Architecture::kQwen2, Architecture::kQwen3, Architecture::kMistral}) {
    EXPECT_EQ(architecture_from_hf_name(architecture_hf_name(arch)), arch);
    EXPECT_EQ(architecture_from_short_name(architecture_short_name(arch)), arch);
  }
  EXPECT_STREQ(architecture_hf_name(Architecture::kQwen3), "Qwen3ForCausalLM");
  EXPECT_STREQ(architecture_short_name(Architecture::kMistral), "mistral");
  expect_error([] { architecture_from_short_name("gpt2"); }, ErrorKind::kUnsupported, {"gpt2"});
}

TEST(HfConfigTest, ErrorsNameTheFileAndField) {
  const std::string path = "/models/x/config.json";
  json unknown = llama31_config();
  unknown["architectures"] = {"GPT2LMHeadModel"};
  expect_error([&] { parse_hf_config(unknown, path); }, ErrorKind::kUnsupported, {path, "GPT2LMHeadModel"});

  json yarn = llama31_config();
  yarn["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  expect_error([&] { parse_hf_config(yarn, path); }, ErrorKind::kUnsupported, {path, "yarn"});

  json incomplete_llama3 = llama31_config();
  incomplete_llama3["rope_scaling"].erase("low_freq_factor");
  expect_error([&] { parse_hf_config(incomplete_llama3, path); }, ErrorKind::kFormat, {path, "low_freq_factor"});

  json missing = llama31_config();
  missing.erase("hidden_size");
  expect_error([&] { parse_hf_config(missing, path); }, ErrorKind::kFormat, {path, "hidden_size"});

  json ill_typed = llama31_config();
  ill_typed["num_hidden_layers"] = "32";
  expect_error([&] { parse_hf_config(ill_typed, path); }, ErrorKind::kFormat, {path, "num_hidden_layers"});

  json gelu = llama31_config();
  gelu["hidden_act"] = "gelu";
  expect_error([&] { parse_hf_config(gelu, path); }, ErrorKind::kUnsupported, {path, "gelu"});

  json uneven = llama31_config();
  uneven["num_key_value_heads"] = 5;
  expect_error([&] { parse_hf_config(uneven, path); }, ErrorKind::kFormat, {path, "num_key_value_heads"});

  json bad_eos = llama31_config();
  bad_eos["eos_token_id"] = 200000;
  expect_error([&] { parse_hf_config(bad_eos, path); }, ErrorKind::kFormat, {path, "eos_token_id"});

  expect_error([&] { parse_hf_config(json::array(), path); }, ErrorKind::kFormat, {path});
}

TEST(HfConfigTest, ReadHfConfigFileErrors) {
  test::TempDir dir;
  const std::string path = dir.str() + "/config.json";
  expect_error([&] { read_hf_config(path); }, ErrorKind::kNotFound, {path});
  std::ofstream(path) << "{\"architectures\": [";
  expect_error([&] { read_hf_config(path); }, ErrorKind::kFormat, {path, "JSON"});
}

TEST(HfConfigTest, WriterRoundTripsEveryArchitecture) {
  std::vector<ModelConfig> configs;
  configs.push_back(parse_hf_config(llama31_config(), "config.json"));
  ModelConfig qwen2 = configs[0];
  qwen2.arch = Architecture::kQwen2;
  qwen2.rope_scaling = {};
  qwen2.qkv_bias = true;
  qwen2.tie_word_embeddings = true;
  qwen2.eos_token_ids = {5};
  configs.push_back(qwen2);
  ModelConfig qwen3 = qwen2;
  qwen3.arch = Architecture::kQwen3;
  qwen3.qkv_bias = false;
  qwen3.qk_norm = true;
  qwen3.head_dim = 256;
  qwen3.bos_token_id = -1;
  configs.push_back(qwen3);
  ModelConfig mistral = qwen2;
  mistral.arch = Architecture::kMistral;
  mistral.qkv_bias = false;
  mistral.sliding_window = 4096;
  mistral.rms_norm_eps = 1e-5f;
  configs.push_back(mistral);

  for (const ModelConfig& config : configs) {
    SCOPED_TRACE(architecture_hf_name(config.arch));
    json written = hf_config_to_json(config);
    // transformers 5 reads rope_parameters (checked with AutoConfig 5.17); rope_theta is kept for 4.x.
    EXPECT_EQ(written["rope_parameters"]["rope_theta"].get<double>(), config.rope_theta);
    ModelConfig back = parse_hf_config(written, "written");
    EXPECT_EQ(back.arch, config.arch);
    EXPECT_EQ(back.vocab_size, config.vocab_size);
    EXPECT_EQ(back.hidden_size, config.hidden_size);
    EXPECT_EQ(back.intermediate_size, config.intermediate_size);
    EXPECT_EQ(back.num_layers, config.num_layers);
    EXPECT_EQ(back.num_heads, config.num_heads);
    EXPECT_EQ(back.num_kv_heads, config.num_kv_heads);
    EXPECT_EQ(back.head_dim, config.head_dim);
    EXPECT_EQ(back.max_position_embeddings, config.max_position_embeddings);
    EXPECT_EQ(back.rms_norm_eps, config.rms_norm_eps);
    EXPECT_EQ(back.rope_theta, config.rope_theta);
    EXPECT_EQ(back.rope_scaling.type, config.rope_scaling.type);
    EXPECT_EQ(back.rope_scaling.factor, config.rope_scaling.factor);
    EXPECT_EQ(back.rope_scaling.original_max_position_embeddings,
              config.rope_scaling.original_max_position_embeddings);
    EXPECT_EQ(back.tie_word_embeddings, config.tie_word_embeddings);
    EXPECT_EQ(back.qkv_bias, config.qkv_bias);
    EXPECT_EQ(back.o_bias, config.o_bias);
    EXPECT_EQ(back.qk_norm, config.qk_norm);
    EXPECT_EQ(back.sliding_window, config.sliding_window);
    EXPECT_EQ(back.bos_token_id, config.bos_token_id);
    EXPECT_EQ(back.eos_token_ids, config.eos_token_ids);
  }
  // Shortest float spelling, as published configs have it.
  EXPECT_EQ(hf_config_to_json(configs[0])["rms_norm_eps"].dump(), "1e-05");
}

TEST(HfConfigTest, WriterRefusesCombinationsTheArchitectureCannotExpress) {
  ModelConfig config = parse_hf_config(llama31_config(), "config.json");
  config.arch = Architecture::kQwen2;  // Qwen2 always has q/k/v biases
  expect_error([&] { hf_config_to_json(config); }, ErrorKind::kUnsupported, {"Qwen2ForCausalLM"});
  config.arch = Architecture::kLlama;
  config.qkv_bias = true;  // attention_bias covers q/k/v and o together
  expect_error([&] { hf_config_to_json(config); }, ErrorKind::kUnsupported, {"LlamaForCausalLM"});
}

}  // namespace
}  // namespace loom
