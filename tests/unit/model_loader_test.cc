// build_model_weights (shapes, tying, optional parts, errors) and load_model for
// Hugging Face directories and GGUF files.
#include "model/loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>

#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/gguf_config.h"
#include "model/hf_config.h"
#include "model/weights.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace loom {
namespace {

using test::TempDir;

using test::expect_error;

ModelConfig tiny_config(Architecture arch = Architecture::kLlama) {
  ModelConfig config;
  config.arch = arch;
  config.vocab_size = 10;
  config.hidden_size = 8;
  config.intermediate_size = 12;
  config.num_layers = 2;
  config.num_heads = 2;
  config.num_kv_heads = 1;
  config.head_dim = 4;
  config.max_position_embeddings = 64;
  config.eos_token_ids = {2};
  return config;
}

// Every tensor `config` needs, filled with distinct values.
TensorMap tiny_tensors(const ModelConfig& config, bool with_lm_head = true) {
  TensorMap tensors;
  float next = 0.0f;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    int64_t count = 1;
    for (int64_t dim : shape) count *= dim;
    std::vector<float> values(count);
    for (float& value : values) value = next++;
    tensors[name] = Tensor::from_vector(std::move(shape), std::move(values));
  };
  const int64_t h = config.hidden_size, q = config.q_size(), kv = config.kv_size(), f = config.intermediate_size;
  add("model.embed_tokens.weight", {config.vocab_size, h});
  add("model.norm.weight", {h});
  if (with_lm_head) add("lm_head.weight", {config.vocab_size, h});
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    add(p + "input_layernorm.weight", {h});
    add(p + "self_attn.q_proj.weight", {q, h});
    add(p + "self_attn.k_proj.weight", {kv, h});
    add(p + "self_attn.v_proj.weight", {kv, h});
    add(p + "self_attn.o_proj.weight", {h, q});
    if (config.qkv_bias) {
      add(p + "self_attn.q_proj.bias", {q});
      add(p + "self_attn.k_proj.bias", {kv});
      add(p + "self_attn.v_proj.bias", {kv});
    }
    if (config.o_bias) add(p + "self_attn.o_proj.bias", {h});
    if (config.qk_norm) {
      add(p + "self_attn.q_norm.weight", {config.head_dim});
      add(p + "self_attn.k_norm.weight", {config.head_dim});
    }
    add(p + "post_attention_layernorm.weight", {h});
    add(p + "mlp.gate_proj.weight", {f, h});
    add(p + "mlp.up_proj.weight", {f, h});
    add(p + "mlp.down_proj.weight", {h, f});
  }
  return tensors;
}

TEST(ModelWeightsTest, PicksEveryTensorAndInvertsBackToTheSameMap) {
  ModelConfig config = tiny_config(Architecture::kQwen3);
  config.qkv_bias = config.o_bias = true;
  config.qk_norm = true;
  TensorMap tensors = tiny_tensors(config);
  tensors["model.rotary_emb.inv_freq"] = Tensor::from_vector({2}, {1, 2});  // extras are ignored
  ModelWeights weights = build_model_weights(config, tensors, "src");
  ASSERT_EQ(weights.layers.size(), 2u);
  EXPECT_EQ(weights.embed_tokens.data, tensors.at("model.embed_tokens.weight").data);
  EXPECT_EQ(weights.lm_head.data, tensors.at("lm_head.weight").data);
  EXPECT_EQ(weights.layers[1].k_norm.data, tensors.at("model.layers.1.self_attn.k_norm.weight").data);
  EXPECT_EQ(weights.layers[0].o_bias.shape, std::vector<int64_t>{8});
  EXPECT_EQ(weights.layers[0].down_proj.shape, (std::vector<int64_t>{8, 12}));

  TensorMap back = model_weights_to_tensor_map(config, weights);
  tensors.erase("model.rotary_emb.inv_freq");
  ASSERT_EQ(back.size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    ASSERT_EQ(back.count(name), 1u) << name;
    EXPECT_EQ(back.at(name).data, tensor.data) << name;
  }
}

TEST(ModelWeightsTest, OptionalPartsStayEmptyWhenTheConfigHasNone) {
  ModelConfig config = tiny_config();
  ModelWeights weights = build_model_weights(config, tiny_tensors(config), "src");
  EXPECT_TRUE(weights.layers[0].q_bias.empty());
  EXPECT_TRUE(weights.layers[0].o_bias.empty());
  EXPECT_TRUE(weights.layers[0].q_norm.empty());
}

TEST(ModelWeightsTest, TiedEmbeddingsShareStorageAndAreWrittenOnce) {
  ModelConfig config = tiny_config();
  config.tie_word_embeddings = true;
  for (bool checkpoint_has_lm_head : {false, true}) {
    TensorMap tensors = tiny_tensors(config, checkpoint_has_lm_head);
    ModelWeights weights = build_model_weights(config, tensors, "src");
    EXPECT_EQ(weights.lm_head.data, weights.embed_tokens.data);
    EXPECT_EQ(weights.lm_head.storage, weights.embed_tokens.storage);
    EXPECT_EQ(model_weights_to_tensor_map(config, weights).count("lm_head.weight"), 0u);
  }
  config.tie_word_embeddings = false;
  expect_error([&] { build_model_weights(config, tiny_tensors(config, false), "/m/dir"); }, ErrorKind::kNotFound,
               {"/m/dir", "lm_head.weight"});
}

TEST(ModelWeightsTest, MissingTensorsAndShapeMismatchesNameSourceAndTensor) {
  ModelConfig config = tiny_config();
  TensorMap missing = tiny_tensors(config);
  missing.erase("model.layers.1.mlp.up_proj.weight");
  expect_error([&] { build_model_weights(config, missing, "/models/a"); }, ErrorKind::kNotFound,
               {"/models/a", "model.layers.1.mlp.up_proj.weight"});

  TensorMap wrong_shape = tiny_tensors(config);
  wrong_shape["model.layers.0.self_attn.k_proj.weight"] = Tensor::from_vector({8, 8}, std::vector<float>(64));
  expect_error([&] { build_model_weights(config, wrong_shape, "/models/b"); }, ErrorKind::kFormat,
               {"/models/b", "model.layers.0.self_attn.k_proj.weight", "[8, 8]", "[4, 8]"});

  ModelConfig with_bias = config;
  with_bias.qkv_bias = true;
  expect_error([&] { build_model_weights(with_bias, tiny_tensors(config), "/models/c"); }, ErrorKind::kNotFound,
               {"/models/c", "model.layers.0.self_attn.q_proj.bias"});

  ModelConfig inconsistent = config;
  inconsistent.num_kv_heads = 3;
  expect_error([&] { build_model_weights(inconsistent, tiny_tensors(config), "/models/d"); }, ErrorKind::kFormat,
               {"/models/d"});
}

TEST(ModelWeightsTest, FromVectorOwnsACopy) {
  std::vector<float> values = {1, 2, 3, 4, 5, 6};
  Tensor tensor = Tensor::from_vector({2, 3}, values);
  values[0] = 100;
  EXPECT_EQ(tensor.numel(), 6);
  EXPECT_EQ(tensor.data[0], 1.0f);
  EXPECT_EQ(tensor.data[5], 6.0f);
  EXPECT_FALSE(tensor.empty());
  EXPECT_TRUE(Tensor().empty());
}

// A Hugging Face directory built from the tiny GGUF fixture's weights, with its
// tokenizer exported through the Tokenizer interface.
void write_hf_directory(const std::string& directory, const ModelConfig& config, const TensorMap& tensors,
                        StoredDtype dtype) {
  std::ofstream(directory + "/config.json") << hf_config_to_json(config).dump(2);
  write_safetensors(directory + "/model.safetensors", tensors, dtype);
  GgufFile gguf = read_gguf(test::fixture_path("formats/tiny_llama.gguf"));
  auto tokenizer = Tokenizer::from_gguf(gguf);
  std::ofstream(directory + "/tokenizer.json") << tokenizer->to_hf_tokenizer_json();
  std::ofstream(directory + "/tokenizer_config.json") << tokenizer->to_hf_tokenizer_config_json();
}

TEST(LoadModelTest, HfDirectoryAndGgufGiveTheSameModel) {
  const std::string gguf_path = test::fixture_path("formats/tiny_llama.gguf");
  LoadedModel from_gguf = load_model(gguf_path);
  EXPECT_EQ(from_gguf.path, gguf_path);
  EXPECT_EQ(from_gguf.config.num_layers, 2);
  ASSERT_NE(from_gguf.tokenizer, nullptr);
  EXPECT_EQ(from_gguf.tokenizer->vocab_size(), 32);

  TempDir dir;
  write_hf_directory(dir.str(), from_gguf.config,
                     model_weights_to_tensor_map(from_gguf.config, *from_gguf.weights), StoredDtype::kF32);
  LoadedModel from_hf = load_model(dir.str());
  EXPECT_EQ(from_hf.config.hidden_size, 64);
  EXPECT_EQ(from_hf.config.rope_theta, 50000.0f);
  ASSERT_NE(from_hf.tokenizer, nullptr);
  EXPECT_EQ(from_hf.tokenizer->encode("ab", false), from_gguf.tokenizer->encode("ab", false));
  const Tensor& a = from_gguf.weights->layers[1].q_proj;
  const Tensor& b = from_hf.weights->layers[1].q_proj;
  ASSERT_EQ(a.shape, b.shape);
  EXPECT_EQ(std::memcmp(a.data, b.data, a.numel() * 4), 0);
  EXPECT_EQ(std::memcmp(from_gguf.weights->lm_head.data, from_hf.weights->lm_head.data,
                        from_hf.weights->lm_head.numel() * 4), 0);
}

// --cpu-precision auto on a bf16 checkpoint: the matrices stay in 16 bits and
// the CPU backend's kernels give the fp32 path's logits (the same products,
// another summation order).
TEST(LoadModelTest, Bf16CheckpointKeptIn16BitsRunsLikeItsFp32Expansion) {
  const LoadedModel from_gguf = load_model(test::fixture_path("formats/tiny_llama.gguf"));
  TempDir dir;
  write_hf_directory(dir.str(), from_gguf.config,
                     model_weights_to_tensor_map(from_gguf.config, *from_gguf.weights), StoredDtype::kBF16);
  const LoadedModel expanded = load_model(dir.str());
  const LoadedModel kept = load_model(dir.str(), {.keep_quantized = true});
  ASSERT_TRUE(kept.weights->layers[0].q_proj.is_quantized());
  EXPECT_EQ(kept.weights->layers[0].q_proj.quantized.ggml_type, 30u);  // GgmlType::kBF16
  EXPECT_FALSE(expanded.weights->layers[0].q_proj.is_quantized());
  EXPECT_FALSE(kept.weights->final_norm.is_quantized());
  auto logits_of = [](const LoadedModel& model) {
    auto backend = make_cpu_backend(model.config, model.weights);
    backend->allocate_kv_cache({4, 16});
    Batch batch;
    batch.token_ids = {1, 5, 9, 17, 3, 30, 2};
    for (int32_t i = 0; i < 7; ++i) {
      batch.positions.push_back(i);
      batch.adapter_slots.push_back(-1);
    }
    BatchSequence sequence;
    sequence.num_new_tokens = 7;
    sequence.num_blocks = 1;
    sequence.logits_for_all_tokens = true;
    batch.sequences.push_back(sequence);
    batch.block_tables = {0};
    return backend->forward(batch).logits;
  };
  const std::vector<float> want = logits_of(expanded), got = logits_of(kept);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_EQ(want.size(), 7u * 32u);
  float max_diff = 0.0f, max_abs = 0.0f;
  for (size_t i = 0; i < want.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(got[i] - want[i]));
    max_abs = std::max(max_abs, std::fabs(want[i]));
  }
  EXPECT_GT(max_abs, 0.1f);
  EXPECT_LE(max_diff, 1e-5f * max_abs + 1e-6f);
}

TEST(LoadModelTest, BadPaths) {
  expect_error([] { load_model("/no/such/model"); }, ErrorKind::kNotFound, {"/no/such/model"});
  TempDir dir;
  expect_error([&] { load_model(dir.str()); }, ErrorKind::kNotFound, {dir.str(), "config.json"});
  const std::string text = dir.str() + "/notes.txt";
  std::ofstream(text) << "hello";
  expect_error([&] { load_model(text); }, ErrorKind::kUnsupported, {text});
}

TEST(LoadModelTest, DirectoryWithAMissingTensorNamesIt) {
  GgufFile gguf = read_gguf(test::fixture_path("formats/tiny_llama.gguf"));
  ModelConfig config = gguf_model_config(gguf);
  TensorMap tensors = gguf.tensors;
  tensors.erase("model.layers.1.self_attn.o_proj.weight");
  TempDir dir;
  write_hf_directory(dir.str(), config, tensors, StoredDtype::kBF16);
  expect_error([&] { load_model(dir.str()); }, ErrorKind::kNotFound,
               {dir.str(), "model.layers.1.self_attn.o_proj.weight"});
}

}  // namespace
}  // namespace loom
