// Hostile or corrupt files: every reader of config.json,
// tokenizer.json / tokenizer_config.json, adapter_config.json, safetensors and
// GGUF answers with a clean loom::Error naming the file (and tensor or field),
// never a crash, a foreign exception or an internal error. Several cases are
// reproducers the fuzz targets (tests/fuzz) found.
#include <cstdint>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../common/tiny_lora_base.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "formats/safetensors.h"
#include "lora/adapter.h"
#include "lora/adapter_config.h"
#include "lora/peft_matching.h"
#include "model/hf_config.h"
#include "test_util.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace loom {
namespace {

using test::expect_error;
using test::TempDir;
using test::tiny_lora_base;

constexpr int kDeep = 100000;  // far past the 64 levels check_json_nesting allows

std::string deep_array(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A safetensors file with this exact header text and data bytes.
void write_raw_safetensors(const std::filesystem::path& path, const std::string& header, const std::string& data) {
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xFF));
  write_text(path, bytes + header + data);
}

nlohmann::json tiny_llama_config_json() {
  return {{"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 64}, {"hidden_size", 8},
          {"intermediate_size", 16}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
          {"num_key_value_heads", 1}, {"max_position_embeddings", 64}};
}

// An adapter directory with a valid config targeting q_proj (r = 2) and `tensors` as its weights.
std::string write_adapter_dir(const TempDir& dir, const TensorMap& tensors) {
  LoraConfig config;
  config.rank = 2;
  config.alpha = 4.0f;
  config.target_modules = {"q_proj"};
  write_text(dir.path() / "adapter_config.json", lora_config_to_json(config).dump());
  write_safetensors((dir.path() / "adapter_model.safetensors").string(), tensors);
  return dir.str();
}

// --- JSON nesting -----------------------------------------------------------------

TEST(FileReadersHardening, DeeplyNestedAdapterConfigIsAFormatError) {
  TempDir dir;
  const std::string path = (dir.path() / "adapter_config.json").string();
  write_text(path, deep_array(kDeep));
  expect_error([&] { read_lora_config(path); }, ErrorKind::kFormat, {path, "deeper than 64"});
  // The same inside an object, as a real file would hide it.
  write_text(path, "{\"r\": 8, \"target_modules\": " + deep_array(kDeep) + "}");
  expect_error([&] { read_lora_config(path); }, ErrorKind::kFormat, {path, "deeper than 64"});
  expect_error([&] { load_lora_adapter("deep", dir.str(), tiny_lora_base()); }, ErrorKind::kFormat, {path});
}

TEST(FileReadersHardening, NestingUpToTheLimitStillParses) {
  TempDir dir;
  const std::string path = (dir.path() / "adapter_config.json").string();
  // 64 levels in all: the object plus 63 arrays; the parser, not the guard, judges it.
  write_text(path, "{\"r\": 8, \"x\": " + deep_array(63) + "}");
  EXPECT_EQ(read_lora_config(path).rank, 8);
  write_text(path, "{\"r\": 8, \"x\": " + deep_array(64) + "}");
  expect_error([&] { read_lora_config(path); }, ErrorKind::kFormat, {"deeper than 64"});
}

TEST(FileReadersHardening, DeeplyNestedModelConfigIsAFormatError) {
  TempDir dir;
  const std::string path = (dir.path() / "config.json").string();
  nlohmann::json config = tiny_llama_config_json();
  const std::string text = config.dump();
  write_text(path, text.substr(0, text.size() - 1) + ",\"rope_scaling\":" + deep_array(kDeep) + "}");
  expect_error([&] { read_hf_config(path); }, ErrorKind::kFormat, {path, "deeper than 64"});
}

TEST(FileReadersHardening, DeeplyNestedTokenizerFilesAreFormatErrors) {
  TempDir dir;
  const std::string tokenizer_path = (dir.path() / "tokenizer.json").string();
  const std::string config_path = (dir.path() / "tokenizer_config.json").string();
  write_text(tokenizer_path, "{\"model\": {\"vocab\": " + deep_array(kDeep) + "}}");
  write_text(config_path, "{}");
  expect_error([&] { Tokenizer::from_hf_json_file(tokenizer_path, config_path); }, ErrorKind::kFormat,
               {tokenizer_path, "deeper than 64"});
  write_text(tokenizer_path, "{\"model\": {\"vocab\": {\"a\": 0}, \"merges\": []}}");
  write_text(config_path, "{\"chat_template\": " + deep_array(kDeep) + "}");
  expect_error([&] { Tokenizer::from_hf_directory(dir.str()); }, ErrorKind::kFormat, {config_path, "deeper than 64"});
}

TEST(FileReadersHardening, DeeplyNestedSafetensorsHeaderAndIndexAreFormatErrors) {
  TempDir dir;
  const std::filesystem::path file = dir.path() / "model.safetensors";
  write_raw_safetensors(file, "{\"__metadata__\": " + deep_array(kDeep) + "}", "");
  expect_error([&] { read_safetensors(file.string()); }, ErrorKind::kFormat, {file.string(), "deeper than 64"});

  std::filesystem::remove(file);
  const std::string index = (dir.path() / "model.safetensors.index.json").string();
  write_text(index, "{\"weight_map\": {}, \"metadata\": " + deep_array(kDeep) + "}");
  expect_error([&] { read_safetensors_checkpoint(dir.str()); }, ErrorKind::kFormat, {index, "deeper than 64"});
}

// --- adapter tensors and fields ------------------------------------------------------

TEST(FileReadersHardening, HugeLayerIndexInAnAdapterTensorNameIsAFormatError) {
  TempDir dir;
  const std::string name = "base_model.model.model.layers.99999999999.self_attn.q_proj.lora_A.weight";
  write_adapter_dir(dir, {{name, Tensor::from_vector({2, 8}, std::vector<float>(16, 0.0f))}});
  expect_error([&] { load_lora_adapter("huge", dir.str(), tiny_lora_base()); }, ErrorKind::kFormat,
               {"adapter_model.safetensors", name});
  // Fits an int but not the model: the existing check names the layer count.
  const std::string beyond = "base_model.model.model.layers.123456789.self_attn.q_proj.lora_A.weight";
  write_adapter_dir(dir, {{beyond, Tensor::from_vector({2, 8}, std::vector<float>(16, 0.0f))}});
  expect_error([&] { load_lora_adapter("beyond", dir.str(), tiny_lora_base()); }, ErrorKind::kFormat,
               {beyond, "2 layers"});
}

TEST(FileReadersHardening, OutOfRangeAdapterNumbersAreFormatErrors) {
  TempDir dir;
  const std::string path = (dir.path() / "adapter_config.json").string();
  // 2^32 + 2 used to wrap to r = 2; 1e300 as a double was undefined behaviour.
  for (const std::string r : {"4294967298", "1e300", "-9223372036854775809", "18446744073709551615"}) {
    write_text(path, "{\"r\": " + r + ", \"target_modules\": [\"q_proj\"]}");
    expect_error([&] { read_lora_config(path); }, ErrorKind::kFormat, {path, "'r'"});
  }
  write_text(path, "{\"r\": 8, \"layers_to_transform\": [0, 4294967296]}");
  expect_error([&] { read_lora_config(path); }, ErrorKind::kFormat, {"layers_to_transform", "out of range"});
  write_text(path, "{\"r\": 8, \"lora_alpha\": 1e39}");  // a double, but no float
  expect_error([&] { read_lora_config(path); }, ErrorKind::kFormat, {"lora_alpha", "out of range"});
  write_text(path, "{\"r\": 8.0, \"lora_alpha\": 16}");
  EXPECT_EQ(read_lora_config(path).rank, 8);  // integral doubles still count as integers
}

TEST(FileReadersHardening, LayersPatternWithItsOwnGroupIsAFormatError) {
  // Fuzz reproducer (tests/fuzz/corpus/adapter_config/crash-layers-pattern-capture-group):
  // the pattern's group took group 1, and std::stoi("layers") threw std::invalid_argument.
  TempDir dir;
  const std::string path = (dir.path() / "adapter_config.json").string();
  write_text(path, R"j({"r": 8, "target_modules": ["q_proj"], "layers_to_transform": [0], "layers_pattern": "(layers)"})j");
  const LoraConfig config = read_lora_config(path);
  expect_error([&] { plan_lora_modules(config, tiny_lora_base(), path); }, ErrorKind::kFormat,
               {path, "layers_pattern '(layers)'", "captures 'layers'"});
  // A non-capturing group is fine.
  write_text(path, R"j({"r": 8, "target_modules": ["q_proj"], "layers_to_transform": [1], "layers_pattern": "(?:layers)"})j");
  const LoraAdapterPlan plan = plan_lora_modules(read_lora_config(path), tiny_lora_base(), path);
  EXPECT_FALSE(plan[0][static_cast<int>(LoraTarget::kQ)].has_value());
  EXPECT_TRUE(plan[1][static_cast<int>(LoraTarget::kQ)].has_value());
}

// --- safetensors -------------------------------------------------------------------

TEST(FileReadersHardening, SafetensorsShapesThatWouldOverflowAreFormatErrors) {
  TempDir dir;
  const std::filesystem::path file = dir.path() / "w.safetensors";
  // No bytes needed (a zero dimension), but numel() of the rest overflows int64.
  write_raw_safetensors(
      file, R"({"w": {"dtype": "F32", "shape": [0, 4611686018427387904, 4611686018427387904], "data_offsets": [0, 0]}})",
      "");
  expect_error([&] { read_safetensors(file.string()); }, ErrorKind::kFormat, {file.string(), "tensor w", "implausibly large"});
  write_raw_safetensors(
      file, R"({"w": {"dtype": "F32", "shape": [1,1,1,1,1,1,1,1,1], "data_offsets": [0, 4]}})", std::string(4, '\0'));
  expect_error([&] { read_safetensors(file.string()); }, ErrorKind::kFormat, {"tensor w", "dimensions"});
  // A legitimately empty tensor, misaligned (header length 1 mod 4), still reads.
  std::string header = R"({"e": {"dtype": "F32", "shape": [0, 4], "data_offsets": [0, 0]}})";
  header += std::string((4 - header.size() % 4) % 4 + 1, ' ');
  write_raw_safetensors(file, header, "");
  EXPECT_EQ(read_safetensors(file.string()).at("e").numel(), 0);
}

// --- GGUF -----------------------------------------------------------------------------

void add_llama_metadata(GgufWriter& writer, uint64_t num_heads) {
  writer.add_string("general.architecture", "llama");
  writer.add_u32("llama.embedding_length", 8);
  writer.add_u32("llama.feed_forward_length", 16);
  writer.add_u32("llama.block_count", 1);
  writer.add_u64("llama.attention.head_count", num_heads);
  writer.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
}

TEST(FileReadersHardening, GgufTensorWithNoElementsIsAFormatError) {
  // Fuzzer reproducer (tests/fuzz/corpus/gguf/crash-zero-element-f16-tensor):
  // dequantizing zero elements passed a null buffer to memcpy.
  TempDir dir;
  const std::string path = dir.str() + "/empty.gguf";
  GgufWriter writer;
  add_llama_metadata(writer, 2);
  writer.add_tensor("blk.0.ffn_up.weight", {0, 8}, /*F16*/ 1, "");
  writer.write(path);
  expect_error([&] { read_gguf(path); }, ErrorKind::kFormat, {path, "blk.0.ffn_up.weight", "no elements"});
}

TEST(FileReadersHardening, GgufHugeHeadCountDoesNotOverflow) {
  TempDir dir;
  const std::string path = dir.str() + "/heads.gguf";
  GgufWriter writer;
  add_llama_metadata(writer, uint64_t{1} << 62);  // 2 x heads overflowed int64 in the row check
  std::string rows(8 * 8 * sizeof(float), '\0');
  writer.add_tensor("blk.0.attn_q.weight", {8, 8}, /*F32*/ 0, rows);
  writer.write(path);
  expect_error([&] { read_gguf(path); }, ErrorKind::kFormat, {path, "blk.0.attn_q.weight", "heads"});
}

// --- config.json and tokenizer.json ---------------------------------------------------

TEST(FileReadersHardening, ModelConfigWithOverflowingHeadProductIsAFormatError) {
  TempDir dir;
  const std::string path = (dir.path() / "config.json").string();
  nlohmann::json config = tiny_llama_config_json();
  config["num_attention_heads"] = 65536;
  config["num_key_value_heads"] = 65536;
  config["head_dim"] = 65536;
  write_text(path, config.dump());
  expect_error([&] { read_hf_config(path); }, ErrorKind::kFormat, {path, "head_dim"});
  config = tiny_llama_config_json();
  config["rope_theta"] = 1e39;  // beyond float: was an infinite theta
  write_text(path, config.dump());
  expect_error([&] { read_hf_config(path); }, ErrorKind::kFormat, {path, "rope_theta", "out of range"});
}

TEST(FileReadersHardening, TokenizerVocabularyIdsMustBeDenseIntegers) {
  TempDir dir;
  const std::string path = (dir.path() / "tokenizer.json").string();
  // One entry must not make a 16M-entry table.
  write_text(path, R"({"model": {"vocab": {"a": 16777216}, "merges": []}})");
  expect_error([&] { Tokenizer::from_hf_json_file(path, ""); }, ErrorKind::kFormat, {path, "out of range"});
  write_text(path, R"({"model": {"vocab": {"a": "zero"}, "merges": []}})");
  expect_error([&] { Tokenizer::from_hf_json_file(path, ""); }, ErrorKind::kFormat, {path, "not an integer"});
  write_text(path, R"({"model": {"vocab": ["a"], "merges": []}})");
  expect_error([&] { Tokenizer::from_hf_json_file(path, ""); }, ErrorKind::kFormat, {path, "vocab"});
  write_text(path, R"({"model": {"vocab": {"a": 0, "b": 1, "ab": 1000}, "merges": ["a b"]}})");
  EXPECT_EQ(Tokenizer::from_hf_json_file(path, "")->token_to_id("ab"), 1000);  // a few gaps are fine
}

TEST(FileReadersHardening, TokenizerAddedAndPostProcessorIdsAreChecked) {
  TempDir dir;
  const std::string path = (dir.path() / "tokenizer.json").string();
  // Fuzzer reproducer (tests/fuzz/corpus/tokenizer_json/crash-added-token-int-max): id + 1 overflowed.
  write_text(path, R"({"model": {"vocab": {"a": 0}, "merges": []}, "added_tokens": [{"id": 2147483647, "content": "<big>"}]})");
  expect_error([&] { Tokenizer::from_hf_json_file(path, ""); }, ErrorKind::kFormat, {path, "2147483647"});
  write_text(path, R"({"model": {"vocab": {"a": 0}, "merges": []}, "added_tokens": [{"id": -3, "content": "<neg>"}]})");
  expect_error([&] { Tokenizer::from_hf_json_file(path, ""); }, ErrorKind::kFormat, {path, "-3"});
  // A post-processor id no vocabulary holds would reach the engine in every prompt.
  write_text(path, R"({"model": {"vocab": {"a": 0, "<s>": 1}, "merges": []},
                       "post_processor": {"type": "BertProcessing", "cls": ["<s>", 1], "sep": ["</s>", 99999]}})");
  expect_error([&] { Tokenizer::from_hf_json_file(path, ""); }, ErrorKind::kFormat, {path, "99999"});
  write_text(path, R"({"model": {"vocab": {"a": 0, "<s>": 1}, "merges": []},
                       "post_processor": {"type": "BertProcessing", "cls": ["<s>", 1], "sep": ["<s>", 1]}})");
  EXPECT_EQ(Tokenizer::from_hf_json_file(path, "")->encode("a"), (std::vector<TokenId>{1, 0, 1}));
}

}  // namespace
}  // namespace loom
