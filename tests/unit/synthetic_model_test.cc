// Synthetic models (`loom make-model`): deterministic, loadable, with the
// promised shapes, scales and adapter variety.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "formats/gguf_dequant.h"
#include "formats/safetensors.h"
#include "lora/adapter.h"
#include "lora/peft_matching.h"
#include "model/hf_config.h"
#include "model/loader.h"
#include "model/weights.h"
#include "synthetic/synthetic_model.h"
#include "synthetic/synthetic_weights.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/half.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using test::TempDir;
using test::fnv1a64_hex;
using test::safetensors_metadata;

// Relative path -> bytes of every file under `root`.
std::map<std::string, std::string> directory_contents(const fs::path& root) {
  std::map<std::string, std::string> contents;
  for (const auto& entry : fs::recursive_directory_iterator(root))
    if (entry.is_regular_file()) contents[fs::relative(entry.path(), root).string()] = test::read_file_bytes(entry.path());
  return contents;
}

SyntheticModelOptions options_for(Architecture arch, int num_adapters) {
  SyntheticModelOptions options;
  options.arch = arch;
  options.num_adapters = num_adapters;
  return options;
}

TEST(SyntheticModel, SameSeedSameBytesOtherSeedOtherWeights) {
  TempDir dir;
  SyntheticModelOptions options = options_for(Architecture::kLlama, 4);
  options.alora_invocation = true;
  write_synthetic_model((dir.path() / "a").string(), options);
  write_synthetic_model((dir.path() / "b").string(), options);
  const auto first = directory_contents(dir.path() / "a");
  const auto second = directory_contents(dir.path() / "b");
  EXPECT_TRUE(first.count("config.json"));
  EXPECT_TRUE(first.count("model.safetensors"));
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(first.count(fmt::format("adapters/adapter{}/adapter_config.json", i)));
    EXPECT_TRUE(first.count(fmt::format("adapters/adapter{}/adapter_model.safetensors", i)));
  }
  EXPECT_EQ(first.size(), second.size());
  for (const auto& [name, bytes] : first) EXPECT_TRUE(second.at(name) == bytes) << name << " differs";

  options.seed = 1;
  write_synthetic_model((dir.path() / "c").string(), options);
  const auto third = directory_contents(dir.path() / "c");
  EXPECT_EQ(third.at("config.json"), first.at("config.json"));
  EXPECT_NE(third.at("model.safetensors"), first.at("model.safetensors"));
  EXPECT_NE(third.at("adapters/adapter0/adapter_model.safetensors"),
            first.at("adapters/adapter0/adapter_model.safetensors"));
}

TEST(SyntheticModel, EveryTinyArchLoadsBackWithItsFeatures) {
  for (Architecture arch : {Architecture::kLlama, Architecture::kQwen2, Architecture::kQwen3, Architecture::kMistral}) {
    SCOPED_TRACE(architecture_short_name(arch));
    TempDir dir;
    write_synthetic_model(dir.str(), options_for(arch, 0));
    const ModelConfig expected = synthetic_model_config(arch, SyntheticPreset::kTiny);
    const ModelConfig config = read_hf_config((dir.path() / "config.json").string());
    EXPECT_EQ(config.arch, arch);
    EXPECT_EQ(config.vocab_size, 512);
    EXPECT_EQ(config.hidden_size, expected.hidden_size);
    EXPECT_EQ(config.num_layers, expected.num_layers);
    EXPECT_EQ(config.num_heads, expected.num_heads);
    EXPECT_EQ(config.num_kv_heads, expected.num_kv_heads);
    EXPECT_LT(config.num_kv_heads, config.num_heads);
    EXPECT_EQ(config.head_dim, expected.head_dim);
    EXPECT_EQ(config.intermediate_size, expected.intermediate_size);
    EXPECT_EQ(config.tie_word_embeddings, expected.tie_word_embeddings);
    EXPECT_EQ(config.qkv_bias, expected.qkv_bias);
    EXPECT_EQ(config.qk_norm, expected.qk_norm);
    EXPECT_FLOAT_EQ(config.rope_theta, expected.rope_theta);
    EXPECT_EQ(config.rope_scaling.type, expected.rope_scaling.type);

    const TensorMap tensors = read_safetensors_checkpoint(dir.str());
    const ModelWeights weights = build_model_weights(config, tensors, dir.str());
    EXPECT_EQ(tensors.count("lm_head.weight"), config.tie_word_embeddings ? 0u : 1u);
    EXPECT_EQ(tensors.count("model.layers.0.self_attn.q_proj.bias"), config.qkv_bias ? 1u : 0u);
    EXPECT_EQ(tensors.count("model.layers.0.self_attn.k_norm.weight"), config.qk_norm ? 1u : 0u);

    // Scales: down_proj |w| < 4/sqrt(fan_in) (residual gain), norms in [7/8, 9/8), not constant.
    const Tensor& down = weights.layers[0].down_proj;
    const float bound = 4.0f / std::sqrt(static_cast<float>(config.intermediate_size));
    float max_abs = 0.0f;
    for (int64_t i = 0; i < down.numel(); ++i) max_abs = std::max(max_abs, std::fabs(down.data[i]));
    EXPECT_LE(max_abs, bound);
    EXPECT_GT(max_abs, 0.9f * bound);
    const Tensor& norm = weights.layers[0].post_attention_norm;
    for (int64_t i = 0; i < norm.numel(); ++i) {
      EXPECT_GE(norm.data[i], 0.875f);
      EXPECT_LT(norm.data[i], 1.125f);
    }
    EXPECT_NE(norm.data[0], norm.data[1]);
  }
}

TEST(SyntheticModel, LoadsAsAModelWithItsFamilyTokenizer) {
  TempDir dir;
  write_synthetic_model(dir.str(), options_for(Architecture::kQwen3, 0));
  const LoadedModel model = load_model(dir.str());
  EXPECT_EQ(model.config.arch, Architecture::kQwen3);
  ASSERT_TRUE(model.tokenizer);
  EXPECT_EQ(model.tokenizer->vocab_size(), model.config.vocab_size);
  EXPECT_EQ(model.tokenizer->token_to_id("<|im_end|>"), model.config.vocab_size - 1);
  EXPECT_EQ(model.tokenizer->eos_token_ids(), model.config.eos_token_ids);
  EXPECT_FALSE(model.tokenizer->is_special(synthetic_alora_invocation_tokens(model.config)[0]));
  EXPECT_EQ(model.weights->layers.size(), 2u);

  const ModelConfig llama = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  EXPECT_EQ(llama.bos_token_id, llama.vocab_size - 5);  // <|begin_of_text|>
}

TEST(SyntheticModel, ArchSpecificsOfTinyPresets) {
  const ModelConfig llama = synthetic_model_config(Architecture::kLlama, SyntheticPreset::kTiny);
  EXPECT_TRUE(llama.tie_word_embeddings);
  EXPECT_EQ(llama.rope_scaling.type, RopeScaling::Type::kLlama3);
  const ModelConfig qwen3 = synthetic_model_config(Architecture::kQwen3, SyntheticPreset::kTiny);
  EXPECT_NE(qwen3.head_dim, qwen3.hidden_size / qwen3.num_heads);
  const ModelConfig mistral = synthetic_model_config(Architecture::kMistral, SyntheticPreset::kTiny);
  EXPECT_FALSE(mistral.tie_word_embeddings);
  const ModelConfig big = synthetic_model_config(Architecture::kLlama, SyntheticPreset::k8b);
  EXPECT_EQ(big.hidden_size, 4096);
  EXPECT_EQ(big.num_layers, 32);
  EXPECT_EQ(big.num_heads, 32);
  EXPECT_EQ(big.num_kv_heads, 8);
  EXPECT_EQ(big.intermediate_size, 14336);
  EXPECT_EQ(big.vocab_size, 128256);
  EXPECT_FLOAT_EQ(big.rope_theta, 500000.0f);
  EXPECT_EQ(big.rope_scaling.type, RopeScaling::Type::kLlama3);
  int64_t num_parameters = 0;
  for (const SyntheticTensorSpec& spec : synthetic_base_tensor_specs(big)) num_parameters += spec.numel();
  EXPECT_EQ(num_parameters, 8030261248);  // Meta-Llama-3-8B
  EXPECT_EQ(synthetic_preset_from_name("8b"), SyntheticPreset::k8b);
  const ModelConfig huge = synthetic_model_config(Architecture::kLlama, SyntheticPreset::k70b);
  EXPECT_EQ(huge.hidden_size, 8192);
  EXPECT_EQ(huge.num_layers, 80);
  EXPECT_EQ(huge.num_heads, 64);
  EXPECT_EQ(huge.num_kv_heads, 8);
  EXPECT_EQ(huge.intermediate_size, 28672);
  num_parameters = 0;
  for (const SyntheticTensorSpec& spec : synthetic_base_tensor_specs(huge)) num_parameters += spec.numel();
  EXPECT_EQ(num_parameters, 70553706496);  // Meta-Llama-3-70B
  EXPECT_EQ(synthetic_preset_from_name("70b"), SyntheticPreset::k70b);
  const ModelConfig qwen = synthetic_model_config(Architecture::kQwen3, SyntheticPreset::k14b);
  EXPECT_EQ(qwen.hidden_size, 5120);
  EXPECT_EQ(qwen.num_layers, 40);
  EXPECT_EQ(qwen.num_heads, 40);
  EXPECT_EQ(qwen.num_kv_heads, 8);
  EXPECT_EQ(qwen.head_dim, 128);
  EXPECT_TRUE(qwen.qk_norm);
  EXPECT_EQ(qwen.rope_scaling.type, RopeScaling::Type::kNone);
  num_parameters = 0;
  for (const SyntheticTensorSpec& spec : synthetic_base_tensor_specs(qwen)) num_parameters += spec.numel();
  EXPECT_EQ(num_parameters, 14768307200);  // Qwen/Qwen3-14B
  EXPECT_EQ(synthetic_preset_from_name("14b"), SyntheticPreset::k14b);
  EXPECT_THROW(synthetic_preset_from_name("405b"), Error);
}

TEST(SyntheticModel, AdaptersLoadWithTheirRecipes) {
  TempDir dir;
  SyntheticModelOptions options = options_for(Architecture::kQwen2, 5);
  options.alora_invocation = true;
  options.rank = 4;
  write_synthetic_model(dir.str(), options);
  const ModelConfig config = read_hf_config((dir.path() / "config.json").string());
  std::vector<std::shared_ptr<const LoraAdapter>> adapters;
  for (int i = 0; i < 5; ++i) {
    const std::string name = fmt::format("adapter{}", i);
    adapters.push_back(load_lora_adapter(name, (dir.path() / "adapters" / name).string(), config));
    EXPECT_EQ(adapters.back()->config.alora_invocation_tokens, synthetic_alora_invocation_tokens(config));
  }
  auto count_modules = [&](int i) {
    int count = 0;
    for (const auto& layer : adapters[i]->layers)
      for (const auto& module : layer) count += module.has_value();
    return count;
  };
  EXPECT_EQ(count_modules(0), 7 * 3);
  EXPECT_EQ(count_modules(1), 2 * 3);
  EXPECT_EQ(adapters[1]->max_rank(), 2);
  EXPECT_TRUE(adapters[2]->config.use_rslora);
  EXPECT_EQ(adapters[2]->max_rank(), 8);
  EXPECT_EQ(count_modules(3), 4 * 2);  // even layers 0 and 2
  EXPECT_FALSE(adapters[3]->config.target_modules_regex.empty());
  EXPECT_EQ(count_modules(4), 7 * 3);  // recipe 0 again, other weights
  const auto& a0 = adapters[0]->layers[0][0]->a;
  const auto& a4 = adapters[4]->layers[0][0]->a;
  EXPECT_NE(a0.data[0], a4.data[0]);
  // B is non-zero, so the adapters change the model: uniform * gain / (scale * sqrt(rank)), v_proj gain 1.
  const LoraModuleWeights& v = *adapters[1]->layers[2][static_cast<int>(LoraTarget::kV)];
  float sum_abs = 0.0f;
  for (int64_t i = 0; i < v.b.numel(); ++i) sum_abs += std::fabs(v.b.data[i]);
  EXPECT_NEAR(sum_abs / v.b.numel(), 0.5f / (v.scale * std::sqrt(2.0f)), 0.01f);

  SyntheticModelOptions custom = options_for(Architecture::kLlama, 2);
  custom.targets = {"gate_proj"};
  custom.use_rslora = true;
  const auto specs = synthetic_adapter_specs(custom, config);
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[1].config.target_modules, std::vector<std::string>{"gate_proj"});
  EXPECT_TRUE(specs[1].config.use_rslora);
  custom.targets = {"lm_head"};
  EXPECT_THROW(synthetic_adapter_specs(custom, config), Error);
}

TEST(SyntheticModel, Bf16CheckpointStreamsTheSameValues) {
  TempDir dir;
  ModelConfig config = synthetic_model_config(Architecture::kMistral, SyntheticPreset::kTiny);
  config.torch_dtype = "bfloat16";
  write_synthetic_checkpoint((dir.path() / "bf16").string(), config, 5, StoredDtype::kBF16);
  write_synthetic_checkpoint((dir.path() / "f32").string(), config, 5, StoredDtype::kF32);
  const double bf16_bytes = fs::file_size(dir.path() / "bf16" / "model.safetensors");
  const double f32_bytes = fs::file_size(dir.path() / "f32" / "model.safetensors");
  EXPECT_NEAR(bf16_bytes / f32_bytes, 0.5, 0.01);
  const TensorMap bf16 = read_safetensors_checkpoint((dir.path() / "bf16").string());
  const TensorMap f32 = read_safetensors_checkpoint((dir.path() / "f32").string());
  ASSERT_EQ(bf16.size(), f32.size());
  for (const auto& [name, tensor] : f32) {
    const Tensor& rounded = bf16.at(name);
    ASSERT_EQ(rounded.shape, tensor.shape) << name;
    for (int64_t i = 0; i < tensor.numel(); ++i)
      ASSERT_EQ(rounded.data[i], bf16_to_float(float_to_bf16(tensor.data[i]))) << name << "[" << i << "]";
  }
  // A stream drawn in chunks gives the values drawn at once.
  const SyntheticTensorSpec spec{"x", {1000}, false, 0.5f};
  const Tensor whole = make_synthetic_tensor(spec, 9);
  SyntheticValueStream stream(spec, 9);
  std::vector<float> chunked(1000);
  stream.next(chunked.data(), 300);
  stream.next(chunked.data() + 300, 700);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(chunked[i], whole.data[i]);
}



// The goldens in tests/fixtures/golden were computed by transformers + PEFT on
// models from `loom make-model` (tools/golden/make_fixtures.sh). Regenerating
// those models here must give the same bytes on every machine, and Loom must
// resolve every adapter module to the rank and scaling PEFT used.
TEST(SyntheticModel, GoldenFixturesBelongToTheseModels) {
  struct Fixture {
    const char* name;
    Architecture arch;
    int num_adapters;
    bool alora;
  };
  for (const Fixture& fixture : {Fixture{"llama", Architecture::kLlama, 4, false},
                                 Fixture{"qwen2", Architecture::kQwen2, 4, false},
                                 Fixture{"qwen3", Architecture::kQwen3, 4, false},
                                 Fixture{"mistral", Architecture::kMistral, 4, false},
                                 Fixture{"llama_alora", Architecture::kLlama, 2, true}}) {
    SCOPED_TRACE(fixture.name);
    TempDir dir;
    SyntheticModelOptions options = options_for(fixture.arch, fixture.num_adapters);
    options.alora_invocation = fixture.alora;
    write_synthetic_model(dir.str(), options);
    const nlohmann::json metadata =
        safetensors_metadata(std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/golden/" + fixture.name + ".safetensors");
    int num_checked_files = 0;
    for (const auto& [key, value] : metadata.items()) {
      if (key.rfind("fnv1a64.", 0) != 0) continue;
      const std::string file = key.substr(8);
      EXPECT_EQ(fnv1a64_hex(test::read_file_bytes(dir.path() / file)), value.get<std::string>()) << file << " changed";
      ++num_checked_files;
    }
    EXPECT_EQ(num_checked_files, 2 + 2 * fixture.num_adapters);

    const ModelConfig config = read_hf_config((dir.path() / "config.json").string());
    const nlohmann::json peft_modules = nlohmann::json::parse(metadata.at("peft_modules").get<std::string>());
    for (const auto& [adapter_name, modules] : peft_modules.items()) {
      SCOPED_TRACE(adapter_name);
      auto adapter = load_lora_adapter(adapter_name, (dir.path() / "adapters" / adapter_name).string(), config);
      int num_loom_modules = 0;
      for (int layer = 0; layer < config.num_layers; ++layer) {
        for (int t = 0; t < kNumLoraTargets; ++t) {
          const auto& module = adapter->layers[layer][t];
          if (!module) continue;
          ++num_loom_modules;
          const std::string path = lora_module_path(layer, static_cast<LoraTarget>(t));
          ASSERT_TRUE(modules.contains(path)) << path << " is adapted by Loom but not by PEFT";
          EXPECT_EQ(module->rank, modules[path][0].get<int>()) << path;
          EXPECT_FLOAT_EQ(module->scale, modules[path][1].get<float>()) << path;
        }
      }
      EXPECT_EQ(num_loom_modules, static_cast<int>(modules.size()));
    }
  }
}

TEST(SyntheticModel, BadOptionsAreInvalidArguments) {
  TempDir dir;
  SyntheticModelOptions options = options_for(Architecture::kLlama, 1);
  options.rank = 0;
  EXPECT_THROW(write_synthetic_model(dir.str(), options), Error);
  EXPECT_FALSE(fs::exists(dir.path() / "model.safetensors"));  // nothing written
  options.rank = 4;
  options.num_adapters = -1;
  EXPECT_THROW(write_synthetic_model(dir.str(), options), Error);
}

}  // namespace
}  // namespace loom
