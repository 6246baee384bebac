// convert_gguf_to_hf: the directory it writes loads back (in Loom) as the same
// model, with the files transformers expects. (transformers itself was checked
// once with tools/formats/check_convert_against_transformers.py.)
#include "model/convert.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "formats/safetensors.h"
#include "model/gguf_config.h"
#include "model/hf_config.h"
#include "model/loader.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace loom {
namespace {

using test::TempDir;
namespace fs = std::filesystem;

using test::expect_error;

nlohmann::json read_json(const fs::path& path) {
  std::ifstream stream(path);
  return nlohmann::json::parse(stream);
}

void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& name) {
  ASSERT_EQ(a.shape, b.shape) << name;
  EXPECT_EQ(std::memcmp(a.data, b.data, a.numel() * sizeof(float)), 0) << name;
}

TEST(ConvertTest, TinyLlamaDirectoryHoldsTheExactDequantizedWeights) {
  TempDir dir;
  const std::string out = dir.str() + "/converted";  // created by the converter
  const std::string gguf_path = test::fixture_path("formats/tiny_llama.gguf");
  convert_gguf_to_hf(gguf_path, out);
  for (const char* name : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                           "generation_config.json"})
    EXPECT_TRUE(fs::exists(fs::path(out) / name)) << name;

  nlohmann::json config_json = read_json(fs::path(out) / "config.json");
  EXPECT_EQ(config_json["architectures"], nlohmann::json({"LlamaForCausalLM"}));
  EXPECT_EQ(config_json["torch_dtype"], "float32");
  EXPECT_EQ(config_json["bos_token_id"], 1);
  EXPECT_EQ(config_json["eos_token_id"], 2);
  nlohmann::json generation = read_json(fs::path(out) / "generation_config.json");
  EXPECT_EQ(generation["bos_token_id"], 1);
  EXPECT_EQ(generation["eos_token_id"], 2);

  GgufFile gguf = read_gguf(gguf_path);
  ModelConfig expected_config = gguf_model_config(gguf);
  ModelConfig config = read_hf_config((fs::path(out) / "config.json").string());
  EXPECT_EQ(config.num_heads, expected_config.num_heads);
  EXPECT_EQ(config.num_kv_heads, expected_config.num_kv_heads);
  EXPECT_EQ(config.rope_theta, expected_config.rope_theta);
  EXPECT_EQ(config.rms_norm_eps, expected_config.rms_norm_eps);
  EXPECT_EQ(config.vocab_size, expected_config.vocab_size);
  EXPECT_FALSE(config.tie_word_embeddings);

  // Exactly what gguf-py + the inverse permutation give (the fixture's expectation).
  TensorMap written = read_safetensors((fs::path(out) / "model.safetensors").string());
  TensorMap expected = read_safetensors(test::fixture_path("formats/tiny_llama_expected.safetensors"));
  ASSERT_EQ(written.size(), expected.size());
  for (const auto& [name, tensor] : expected) {
    ASSERT_EQ(written.count(name), 1u) << name;
    expect_same_bits(written.at(name), tensor, name);
  }

  LoadedModel reloaded = load_model(out);
  auto gguf_tokenizer = Tokenizer::from_gguf(gguf);
  for (const std::string text : {"ab a", "<|im_start|>abc<|im_end|>", "zz"})
    EXPECT_EQ(reloaded.tokenizer->encode(text), gguf_tokenizer->encode(text)) << text;
  EXPECT_EQ(reloaded.tokenizer->eos_token_ids(), gguf_tokenizer->eos_token_ids());
}

// A tied llama GGUF (no output.weight) with a byte-free toy vocabulary.
std::string write_tied_gguf(const std::string& path) {
  constexpr int kHidden = 32, kVocab = 6, kFfn = 64;
  GgufWriter writer;
  writer.add_string("general.architecture", "llama");
  writer.add_u32("llama.embedding_length", kHidden);
  writer.add_u32("llama.feed_forward_length", kFfn);
  writer.add_u32("llama.block_count", 1);
  writer.add_u32("llama.attention.head_count", 2);
  writer.add_u32("llama.attention.head_count_kv", 2);
  writer.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-6f);
  writer.add_u32("llama.context_length", 128);
  writer.add_string("tokenizer.ggml.model", "gpt2");
  writer.add_string_array("tokenizer.ggml.tokens", {"<s>", "</s>", "a", "b", "ab", "\xc4\xa0"});
  writer.add_i32_array("tokenizer.ggml.token_type", {3, 3, 1, 1, 1, 1});
  writer.add_string_array("tokenizer.ggml.merges", {"a b"});
  writer.add_u32("tokenizer.ggml.bos_token_id", 0);
  writer.add_u32("tokenizer.ggml.eos_token_id", 1);
  float next = 0.0f;
  auto add = [&](const std::string& name, std::vector<uint64_t> dims) {
    uint64_t count = 1;
    for (uint64_t dim : dims) count *= dim;
    std::vector<float> values(count);
    for (float& value : values) value = (next += 0.25f);
    writer.add_tensor(name, dims, 0, std::string(reinterpret_cast<const char*>(values.data()), count * 4));
  };
  add("token_embd.weight", {kHidden, kVocab});
  add("output_norm.weight", {kHidden});
  add("blk.0.attn_norm.weight", {kHidden});
  add("blk.0.attn_q.weight", {kHidden, kHidden});
  add("blk.0.attn_k.weight", {kHidden, kHidden});
  add("blk.0.attn_v.weight", {kHidden, kHidden});
  add("blk.0.attn_output.weight", {kHidden, kHidden});
  add("blk.0.ffn_norm.weight", {kHidden});
  add("blk.0.ffn_gate.weight", {kHidden, kFfn});
  add("blk.0.ffn_up.weight", {kHidden, kFfn});
  add("blk.0.ffn_down.weight", {kFfn, kHidden});
  writer.write(path);
  return path;
}

TEST(ConvertTest, TiedModelOmitsLmHeadAndReloadsTied) {
  TempDir dir;
  const std::string gguf_path = write_tied_gguf(dir.str() + "/tied.gguf");
  const std::string out = dir.str() + "/out";
  convert_gguf_to_hf(gguf_path, out);
  TensorMap written = read_safetensors(out + "/model.safetensors");
  EXPECT_EQ(written.count("lm_head.weight"), 0u);
  EXPECT_EQ(written.size(), 2u + 9u);
  EXPECT_EQ(read_json(fs::path(out) / "config.json")["tie_word_embeddings"], true);

  LoadedModel from_gguf = load_model(gguf_path);
  LoadedModel from_dir = load_model(out);
  EXPECT_TRUE(from_dir.config.tie_word_embeddings);
  EXPECT_EQ(from_dir.weights->lm_head.data, from_dir.weights->embed_tokens.data);
  expect_same_bits(from_dir.weights->embed_tokens, from_gguf.weights->embed_tokens, "embed");
  expect_same_bits(from_dir.weights->layers[0].q_proj, from_gguf.weights->layers[0].q_proj, "q_proj");
  expect_same_bits(from_dir.weights->layers[0].k_proj, from_gguf.weights->layers[0].k_proj, "k_proj");
  expect_same_bits(from_dir.weights->layers[0].down_proj, from_gguf.weights->layers[0].down_proj, "down_proj");
}

TEST(ConvertTest, Errors) {
  TempDir dir;
  const std::string bad = dir.str() + "/bad.gguf";
  std::ofstream(bad) << "not a gguf file";
  expect_error([&] { convert_gguf_to_hf(bad, dir.str() + "/out"); }, ErrorKind::kFormat, {bad});
  EXPECT_FALSE(fs::exists(dir.str() + "/out"));

  const std::string file_in_the_way = dir.str() + "/occupied";
  std::ofstream(file_in_the_way) << "x";
  expect_error([&] { convert_gguf_to_hf(test::fixture_path("formats/tiny_llama.gguf"), file_in_the_way); },
               ErrorKind::kInvalidArgument, {file_in_the_way});
}

}  // namespace
}  // namespace loom
