// GGUF reading: metadata types, dequantization (checked against values worked
// out here from the block layouts and against gguf-py on a committed fixture),
// HF renaming, Q/K un-permutation, model config, and corrupt files.
#include "formats/gguf.h"
#include "model/gguf_config.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>

#include <gtest/gtest.h>

#include "formats/gguf_writer.h"
#include "formats/safetensors.h"
#include "test_util.h"
#include "util/error.h"
#include "util/half.h"

namespace loom {
namespace {

using test::TempDir;

constexpr uint32_t kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ8_0 = 8, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13,
                   kQ6_K = 14, kBF16 = 30;

using test::expect_error;

std::vector<float> values_of(const Tensor& tensor) {
  return std::vector<float>(tensor.data, tensor.data + tensor.numel());
}

template <typename T>
std::string bytes_of(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

std::string u16(uint16_t value) { return GgufWriter::encode(value); }

// Minimal llama metadata; `num_heads` x `head_dim` = hidden.
void add_llama_metadata(GgufWriter& writer, int hidden, int num_heads, int num_kv_heads,
                        const std::string& arch = "llama") {
  writer.add_string("general.architecture", arch);
  writer.add_u32(arch + ".embedding_length", hidden);
  writer.add_u32(arch + ".feed_forward_length", 2 * hidden);
  writer.add_u32(arch + ".block_count", 1);
  writer.add_u32(arch + ".attention.head_count", num_heads);
  writer.add_u32(arch + ".attention.head_count_kv", num_kv_heads);
  writer.add_f32(arch + ".attention.layer_norm_rms_epsilon", 1e-5f);
}

// Deterministic pseudo-random bytes (no std distributions: same on every platform).
uint32_t next_random(uint32_t& state) {
  state = state * 1664525u + 1013904223u;
  return state >> 8;
}

TEST(GgufTest, QuantizedBlocksDecodeAsTheLayoutSays) {
  TempDir dir;
  GgufWriter writer;
  add_llama_metadata(writer, 32, 1, 1);

  // Q8_0, 2 blocks: f16 d then 32 int8. d = 0.5 and -0.125, q = i - 16 / 3 * i - 40.
  std::string q8;
  std::vector<float> want_q8;
  for (int block = 0; block < 2; ++block) {
    const float d = block == 0 ? 0.5f : -0.125f;
    q8 += u16(float_to_fp16(d));
    for (int i = 0; i < 32; ++i) {
      const int8_t q = static_cast<int8_t>(block == 0 ? i - 16 : 3 * i - 40);
      q8.push_back(static_cast<char>(q));
      want_q8.push_back(d * q);
    }
  }
  writer.add_tensor("q8", {64}, kQ8_0, q8);

  // Q4_0, 1 block: byte j holds element j (low nibble) and element j + 16 (high nibble), minus 8.
  std::string q4_0 = u16(float_to_fp16(0.25f));
  std::vector<float> want_q4_0(32);
  for (int j = 0; j < 16; ++j) {
    const int low = j, high = 15 - j;
    q4_0.push_back(static_cast<char>(low | (high << 4)));
    want_q4_0[j] = 0.25f * (low - 8);
    want_q4_0[j + 16] = 0.25f * (high - 8);
  }
  writer.add_tensor("q4_0", {32}, kQ4_0, q4_0);

  // Q4_1, 1 block: d, then m, then nibbles; x = d * q + m.
  std::string q4_1 = u16(float_to_fp16(1.5f)) + u16(float_to_fp16(-2.0f));
  std::vector<float> want_q4_1(32);
  for (int j = 0; j < 16; ++j) {
    const int low = (j * 7) % 16, high = (j * 5 + 3) % 16;
    q4_1.push_back(static_cast<char>(low | (high << 4)));
    want_q4_1[j] = 1.5f * low - 2.0f;
    want_q4_1[j + 16] = 1.5f * high - 2.0f;
  }
  writer.add_tensor("q4_1", {32}, kQ4_1, q4_1);

  // F16 and BF16 bit patterns, including a subnormal half and a negative zero.
  writer.add_tensor("f16", {4}, kF16, bytes_of(std::vector<uint16_t>{0x3c00, 0xc000, 0x0001, 0x8000}));
  writer.add_tensor("bf16", {2}, kBF16, bytes_of(std::vector<uint16_t>{0x3f80, 0xc040}));
  writer.write(dir.str() + "/blocks.gguf");

  GgufFile gguf = read_gguf(dir.str() + "/blocks.gguf");
  EXPECT_EQ(values_of(gguf.tensors.at("q8")), want_q8);
  EXPECT_EQ(values_of(gguf.tensors.at("q4_0")), want_q4_0);
  EXPECT_EQ(values_of(gguf.tensors.at("q4_1")), want_q4_1);
  EXPECT_EQ(values_of(gguf.tensors.at("f16")), (std::vector<float>{1.0f, -2.0f, 0x1p-24f, -0.0f}));
  EXPECT_TRUE(std::signbit(gguf.tensors.at("f16").data[3]));
  EXPECT_EQ(values_of(gguf.tensors.at("bf16")), (std::vector<float>{1.0f, -3.0f}));
}

// One block each of Q5_0 and the K-quants, a few elements worked out by hand
// from the layouts in formats/gguf_dequant.h (all other quants zero).
TEST(GgufTest, Q5AndKQuantBlocksDecodeAsTheLayoutSays) {
  TempDir dir;
  GgufWriter writer;
  add_llama_metadata(writer, 32, 1, 1);
  // Q5_0: d = 0.25, qh bit 20 set, qs[4] = 0x90: element 20 = (9 | 16) - 16 = 9, element 4 = 0 - 16.
  std::string q5_0 = u16(0x3400) + std::string("\x00\x00\x10\x00", 4) + std::string(16, '\0');
  q5_0[6 + 4] = static_cast<char>(0x90);
  writer.add_tensor("q5_0", {32}, kQ5_0, q5_0);
  // Q4_K / Q5_K: d = 1, dmin = 0.5; sub-block 0: scale 3, min 2; sub-block 5: scale 7 | (1 << 4) = 23
  // (scales[9] low, scales[1] top bits), min 2 | (2 << 4) = 34 (scales[9] high, scales[5] top bits).
  std::string scales(12, '\0');
  scales[0] = 3;
  scales[4] = 2;
  scales[1] = 0x41;
  scales[5] = static_cast<char>(0x84);
  scales[9] = 0x27;
  std::string q4_k_quants(128, '\0');
  q4_k_quants[0] = 0x05;                     // element 0: low nibble of qs[0] = 5
  q4_k_quants[64 + 3] = static_cast<char>(0xa0);  // element 163 (sub-block 5, l = 3): high nibble of qs[67] = 10
  writer.add_tensor("q4_k", {256}, kQ4_K, u16(0x3c00) + u16(0x3800) + scales + q4_k_quants);
  std::string high_bits(32, '\0');
  high_bits[3] = 0x20;  // bit 5 of qh[3]: element 163 gets + 16
  writer.add_tensor("q5_k", {256}, kQ5_K, u16(0x3c00) + u16(0x3800) + scales + high_bits + q4_k_quants);
  // Q6_K: d = 0.5; element 200 (half 1, part 2, l = 8): high nibble of ql[64 + 8] = 7, bits 4-5 of
  // qh[32 + 8] = 3, so q = 7 | 48 = 55, minus 32 = 23, scale[8 + 4] = -3; element 0: q = -32, scale[0] = 2.
  std::string q6_k(210, '\0');
  q6_k[72] = 0x70;
  q6_k[128 + 40] = 0x30;
  q6_k[192 + 0] = 2;
  q6_k[192 + 12] = static_cast<char>(-3);
  q6_k[208] = 0x00;
  q6_k[209] = 0x38;
  writer.add_tensor("q6_k", {256}, kQ6_K, q6_k);
  writer.write(dir.str() + "/k.gguf");

  GgufFile gguf = read_gguf(dir.str() + "/k.gguf");
  const std::vector<float> q5 = values_of(gguf.tensors.at("q5_0"));
  EXPECT_EQ(q5[20], 2.25f);
  EXPECT_EQ(q5[4], -4.0f);
  EXPECT_EQ(q5[5], -4.0f);
  const std::vector<float> q4k = values_of(gguf.tensors.at("q4_k"));
  EXPECT_EQ(q4k[0], 1.0f * 3 * 5 - 0.5f * 2);
  EXPECT_EQ(q4k[1], -0.5f * 2);
  EXPECT_EQ(q4k[163], 1.0f * 23 * 10 - 0.5f * 34);
  EXPECT_EQ(q4k[160], -0.5f * 34);
  const std::vector<float> q5k = values_of(gguf.tensors.at("q5_k"));
  EXPECT_EQ(q5k[163], 1.0f * 23 * 26 - 0.5f * 34);
  EXPECT_EQ(q5k[0], q4k[0]);
  const std::vector<float> q6k = values_of(gguf.tensors.at("q6_k"));
  EXPECT_EQ(q6k[200], 0.5f * -3 * 23);
  EXPECT_EQ(q6k[0], 0.5f * 2 * -32);
}

TEST(GgufTest, KeepQuantizedLeavesMatricesInTheirBlocksAndQkRowsUnpermuted) {
  const std::string model_path = test::smollm2_gguf_path();
  if (model_path.empty()) GTEST_SKIP() << "SmolLM2 GGUF not present";
  const GgufFile fp32 = read_gguf(model_path);
  const GgufFile kept = read_gguf(model_path, {.keep_quantized = true});
  for (const char* name : {"model.layers.0.self_attn.q_proj.weight", "model.layers.3.self_attn.k_proj.weight",
                           "model.layers.0.mlp.down_proj.weight", "model.embed_tokens.weight"}) {
    const Tensor& quantized = kept.tensors.at(name);
    ASSERT_TRUE(quantized.is_quantized()) << name;
    EXPECT_EQ(quantized.data, nullptr);
    EXPECT_EQ(quantized.shape, fp32.tensors.at(name).shape);
    EXPECT_EQ(values_of(to_fp32(quantized)), values_of(fp32.tensors.at(name))) << name;
  }
  EXPECT_FALSE(kept.tensors.at("model.norm.weight").is_quantized());  // F32 stays as it is
}

TEST(GgufTest, Q4_1ManyRandomBlocksMatchTheFormula) {
  // Random d, m and nibbles over many blocks: every element
  // is d * q + m in float, bit for bit.
  TempDir dir;
  GgufWriter writer;
  add_llama_metadata(writer, 32, 1, 1);
  constexpr int kNumBlocks = 256;
  std::string data;
  std::vector<float> want;
  uint32_t state = 7;
  for (int block = 0; block < kNumBlocks; ++block) {
    const uint16_t d_bits = static_cast<uint16_t>(0x2000 + next_random(state) % 0x1800);
    const uint16_t m_bits = static_cast<uint16_t>(0xa000 + next_random(state) % 0x1800);
    data += u16(d_bits) + u16(m_bits);
    std::vector<float> block_values(32);
    for (int j = 0; j < 16; ++j) {
      const uint8_t byte = static_cast<uint8_t>(next_random(state));
      data.push_back(static_cast<char>(byte));
      volatile float low_product = static_cast<float>(byte & 15) * fp16_to_float(d_bits);
      volatile float high_product = static_cast<float>(byte >> 4) * fp16_to_float(d_bits);
      block_values[j] = low_product + fp16_to_float(m_bits);
      block_values[j + 16] = high_product + fp16_to_float(m_bits);
    }
    want.insert(want.end(), block_values.begin(), block_values.end());
  }
  writer.add_tensor("q", {32 * kNumBlocks}, kQ4_1, data);
  writer.write(dir.str() + "/q41.gguf");
  GgufFile gguf = read_gguf(dir.str() + "/q41.gguf");
  const std::vector<float> got = values_of(gguf.tensors.at("q"));
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
}

TEST(GgufTest, MetadataOfEveryTypeAndTorchShapes) {
  TempDir dir;
  GgufWriter writer;
  add_llama_metadata(writer, 32, 1, 1);
  writer.add_raw("u8", GgufWriter::kU8, GgufWriter::encode<uint8_t>(200));
  writer.add_raw("i8", GgufWriter::kI8, GgufWriter::encode<int8_t>(-100));
  writer.add_raw("u16", GgufWriter::kU16, GgufWriter::encode<uint16_t>(60000));
  writer.add_raw("i16", GgufWriter::kI16, GgufWriter::encode<int16_t>(-30000));
  writer.add_i32("i32", -5);
  writer.add_u64("u64", 1ull << 40);
  writer.add_i64("i64", -(1ll << 40));
  writer.add_f64("f64", 0.1);
  writer.add_bool("flag", true);
  writer.add_string("text", "héllo");
  writer.add_i32_array("ints", {3, -1, 4});
  writer.add_f32_array("floats", {0.5f, -1.0f});
  writer.add_string_array("strings", {"a", "", "ccc"});
  // Array of arrays: parsed and skipped; the entry after it must still be read.
  std::string nested = GgufWriter::encode<uint32_t>(GgufWriter::kArray) + GgufWriter::encode<uint64_t>(1) +
                       GgufWriter::encode<uint32_t>(GgufWriter::kI32) + GgufWriter::encode<uint64_t>(2) +
                       GgufWriter::encode<int32_t>(1) + GgufWriter::encode<int32_t>(2);
  writer.add_raw("nested", GgufWriter::kArray, nested);
  writer.add_string("after", "still here");
  std::vector<float> matrix(3 * 32);
  for (size_t i = 0; i < matrix.size(); ++i) matrix[i] = static_cast<float>(i);
  writer.add_tensor("matrix", {32, 3}, kF32, bytes_of(matrix));  // ggml ne = [32, 3] -> torch [3, 32]
  writer.write(dir.str() + "/meta.gguf", /*version=*/2);

  GgufFile gguf = read_gguf(dir.str() + "/meta.gguf");
  EXPECT_EQ(gguf.version, 2u);
  EXPECT_EQ(gguf.get_int("u8"), 200);
  EXPECT_EQ(gguf.get_int("i8"), -100);
  EXPECT_EQ(gguf.get_int("u16"), 60000);
  EXPECT_EQ(gguf.get_int("i16"), -30000);
  EXPECT_EQ(gguf.get_int("i32"), -5);
  EXPECT_EQ(gguf.get_int("u64"), 1ll << 40);
  EXPECT_EQ(gguf.get_int("i64"), -(1ll << 40));
  EXPECT_EQ(gguf.get_float("f64"), 0.1);
  EXPECT_EQ(gguf.get_float("llama.attention.layer_norm_rms_epsilon"), static_cast<double>(1e-5f));
  EXPECT_EQ(gguf.get_float("i32"), -5.0);
  EXPECT_EQ(std::get<bool>(gguf.metadata.at("flag")), true);
  EXPECT_EQ(gguf.get_string("text"), "héllo");
  EXPECT_EQ(std::get<std::vector<int64_t>>(gguf.metadata.at("ints")), (std::vector<int64_t>{3, -1, 4}));
  EXPECT_EQ(std::get<std::vector<double>>(gguf.metadata.at("floats")), (std::vector<double>{0.5, -1.0}));
  EXPECT_EQ(gguf.get_string_array("strings"), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_FALSE(gguf.has("nested"));
  EXPECT_EQ(gguf.get_string("after"), "still here");

  const Tensor& tensor = gguf.tensors.at("matrix");
  EXPECT_EQ(tensor.shape, (std::vector<int64_t>{3, 32}));
  EXPECT_EQ(tensor.data[1 * 32 + 5], 37.0f);  // row 1, column 5

  expect_error([&] { gguf.get_int("text"); }, ErrorKind::kFormat, {dir.str() + "/meta.gguf", "text"});
  expect_error([&] { gguf.get_string("i32"); }, ErrorKind::kFormat, {"meta.gguf", "i32"});
  expect_error([&] { gguf.get_string_array("ints"); }, ErrorKind::kFormat, {"meta.gguf", "ints"});
  expect_error([&] { gguf.get_float("missing.key"); }, ErrorKind::kFormat, {"meta.gguf", "missing.key"});
}

TEST(GgufTest, HonoursGeneralAlignment) {
  TempDir dir;
  for (uint32_t alignment : {8u, 64u}) {
    GgufWriter writer;
    add_llama_metadata(writer, 32, 1, 1);
    writer.set_alignment(alignment);
    writer.add_tensor("a", {3}, kF32, bytes_of(std::vector<float>{1, 2, 3}));
    writer.add_tensor("b", {2}, kF32, bytes_of(std::vector<float>{4, 5}));
    const std::string path = dir.str() + "/aligned" + std::to_string(alignment) + ".gguf";
    writer.write(path);
    GgufFile gguf = read_gguf(path);
    EXPECT_EQ(values_of(gguf.tensors.at("a")), (std::vector<float>{1, 2, 3}));
    EXPECT_EQ(values_of(gguf.tensors.at("b")), (std::vector<float>{4, 5}));
  }
}

// Q rows of a 2-head, head_dim-4 model labelled by their GGUF row index.
TEST(GgufTest, RenamesToHfAndUnpermutesQueryAndKeyRows) {
  constexpr int kHidden = 32, kHeads = 4, kKvHeads = 2, kHeadDim = 8;
  TempDir dir;
  for (const std::string arch : {"llama", "qwen2"}) {
    GgufWriter writer;
    add_llama_metadata(writer, kHidden, kHeads, kKvHeads, arch);
    auto labelled = [](int num_rows, int row_length) {
      std::vector<float> values(num_rows * row_length);
      for (int r = 0; r < num_rows; ++r)
        for (int c = 0; c < row_length; ++c) values[r * row_length + c] = r * 1000.0f + c;
      return values;
    };
    writer.add_tensor("blk.0.attn_q.weight", {kHidden, kHeads * kHeadDim}, kF32, bytes_of(labelled(32, kHidden)));
    writer.add_tensor("blk.0.attn_k.weight", {kHidden, kKvHeads * kHeadDim}, kF32, bytes_of(labelled(16, kHidden)));
    writer.add_tensor("blk.0.attn_v.weight", {kHidden, kKvHeads * kHeadDim}, kF32, bytes_of(labelled(16, kHidden)));
    writer.add_tensor("blk.0.attn_q.bias", {kHeads * kHeadDim}, kF32, bytes_of(labelled(32, 1)));
    writer.add_tensor("blk.0.attn_k.bias", {kKvHeads * kHeadDim}, kF32, bytes_of(labelled(16, 1)));
    writer.add_tensor("blk.0.ffn_down.weight", {2 * kHidden, kHidden}, kF32, bytes_of(labelled(kHidden, 2 * kHidden)));
    writer.add_tensor("token_embd.weight", {kHidden, 4}, kF32, bytes_of(labelled(4, kHidden)));
    writer.add_tensor("rope_freqs.weight", {4}, kF32, bytes_of(labelled(4, 1)));
    const std::string path = dir.str() + "/" + arch + ".gguf";
    writer.write(path);
    GgufFile gguf = read_gguf(path);
    SCOPED_TRACE(arch);

    const Tensor& q = gguf.tensors.at("model.layers.0.self_attn.q_proj.weight");
    const Tensor& k = gguf.tensors.at("model.layers.0.self_attn.k_proj.weight");
    const Tensor& v = gguf.tensors.at("model.layers.0.self_attn.v_proj.weight");
    const Tensor& q_bias = gguf.tensors.at("model.layers.0.self_attn.q_proj.bias");
    const Tensor& k_bias = gguf.tensors.at("model.layers.0.self_attn.k_proj.bias");
    EXPECT_EQ(q.shape, (std::vector<int64_t>{32, kHidden}));
    EXPECT_EQ(k.shape, (std::vector<int64_t>{16, kHidden}));
    EXPECT_EQ(gguf.tensors.at("model.layers.0.mlp.down_proj.weight").shape, (std::vector<int64_t>{kHidden, 2 * kHidden}));
    EXPECT_EQ(gguf.tensors.count("model.embed_tokens.weight"), 1u);
    EXPECT_EQ(gguf.tensors.count("rope_freqs.weight"), 1u);  // unknown names are kept as they are

    // HF row h*d + j*(d/2) + i comes from GGUF row h*d + 2*i + j (llama only).
    for (int h = 0; h < kHeads; ++h)
      for (int j = 0; j < 2; ++j)
        for (int i = 0; i < kHeadDim / 2; ++i) {
          const int hf_row = h * kHeadDim + j * (kHeadDim / 2) + i;
          const int gguf_row = arch == "llama" ? h * kHeadDim + 2 * i + j : hf_row;
          EXPECT_EQ(q.data[hf_row * kHidden + 3], gguf_row * 1000.0f + 3) << "q row " << hf_row;
          EXPECT_EQ(q_bias.data[hf_row], gguf_row * 1000.0f) << "q bias " << hf_row;
          if (h < kKvHeads) {
            EXPECT_EQ(k.data[hf_row * kHidden + 7], gguf_row * 1000.0f + 7) << "k row " << hf_row;
            EXPECT_EQ(k_bias.data[hf_row], gguf_row * 1000.0f) << "k bias " << hf_row;
          }
        }
    for (int row = 0; row < 16; ++row) EXPECT_EQ(v.data[row * kHidden], row * 1000.0f);  // V untouched
  }
}

TEST(GgufTest, FixtureFromGgufPyMatchesItsDequantizationExactly) {
  // tools/formats/make_format_fixtures.py: gguf-py quantized the tensors, dequantized
  // them with gguf.quants.dequantize and inverted llama.cpp's Q/K permutation.
  GgufFile gguf = read_gguf(test::fixture_path("formats/tiny_llama.gguf"));
  TensorMap expected = read_safetensors(test::fixture_path("formats/tiny_llama_expected.safetensors"));
  ASSERT_EQ(gguf.tensors.size(), expected.size());
  for (const auto& [name, want] : expected) {
    SCOPED_TRACE(name);
    ASSERT_EQ(gguf.tensors.count(name), 1u);
    const Tensor& got = gguf.tensors.at(name);
    ASSERT_EQ(got.shape, want.shape);
    EXPECT_EQ(std::memcmp(got.data, want.data, want.numel() * sizeof(float)), 0);
  }

  ModelConfig config = gguf_model_config(gguf);
  EXPECT_EQ(config.arch, Architecture::kLlama);
  EXPECT_EQ(config.vocab_size, 32);
  EXPECT_EQ(config.hidden_size, 64);
  EXPECT_EQ(config.intermediate_size, 96);
  EXPECT_EQ(config.num_layers, 2);
  EXPECT_EQ(config.num_heads, 4);
  EXPECT_EQ(config.num_kv_heads, 2);
  EXPECT_EQ(config.head_dim, 16);
  EXPECT_EQ(config.max_position_embeddings, 256);
  EXPECT_EQ(config.rope_theta, 50000.0f);
  EXPECT_EQ(config.rms_norm_eps, 1e-5f);
  EXPECT_FALSE(config.tie_word_embeddings);  // output.weight is present
  EXPECT_FALSE(config.qkv_bias);
  EXPECT_EQ(config.bos_token_id, 1);
  EXPECT_EQ(config.eos_token_ids, std::vector<int>{2});
}

TEST(GgufTest, ConfigTiesEmbeddingsWithoutOutputAndReadsQwenFlags) {
  TempDir dir;
  GgufWriter writer;
  add_llama_metadata(writer, 32, 4, 2, "qwen3");
  writer.add_u32("qwen3.attention.key_length", 16);  // head_dim != hidden / heads
  writer.add_f32("qwen3.rope.freq_base", 1e6f);
  writer.add_u32("qwen3.context_length", 4096);
  writer.add_string_array("tokenizer.ggml.tokens", std::vector<std::string>(40, "t"));
  writer.add_u32("tokenizer.ggml.eos_token_id", 7);
  writer.add_tensor("token_embd.weight", {32, 40}, kF32, bytes_of(std::vector<float>(32 * 40)));
  writer.write(dir.str() + "/qwen3.gguf");
  GgufFile gguf = read_gguf(dir.str() + "/qwen3.gguf");
  ModelConfig config = gguf_model_config(gguf);
  EXPECT_EQ(config.arch, Architecture::kQwen3);
  EXPECT_TRUE(config.qk_norm);
  EXPECT_EQ(config.head_dim, 16);
  EXPECT_EQ(config.vocab_size, 40);
  EXPECT_EQ(config.rope_theta, 1e6f);
  EXPECT_EQ(config.max_position_embeddings, 4096);
  EXPECT_TRUE(config.tie_word_embeddings);
  EXPECT_EQ(config.bos_token_id, -1);
  EXPECT_EQ(config.eos_token_ids, std::vector<int>{7});
}

// llama.cpp's converter bakes Llama 3's rope scaling into rope_freqs.weight.
// These are its values for Llama 3.2 (theta 500000, factor 32), computed by the
// converter's own formula in torch float32, for head_dim 64.
constexpr float kLlama32RopeFreqs[32] = {
    1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f,
    1.6513292789459229f, 3.2922627925872803f, 9.666730880737305f, 32.0f, 32.0f, 32.0f, 32.0f, 32.0f,
    32.0f, 32.0f, 32.0f, 32.0f, 32.0f, 32.0f, 32.0f, 32.0f, 32.0f};

std::string write_rope_freqs_model(const std::string& path, std::vector<float> factors) {
  GgufWriter writer;
  add_llama_metadata(writer, 128, 2, 2);  // head_dim 64
  writer.add_f32("llama.rope.freq_base", 500000.0f);
  writer.add_u32("llama.vocab_size", 16);
  writer.add_tensor("rope_freqs.weight", {factors.size()}, kF32, bytes_of(factors));
  writer.write(path);
  return path;
}

TEST(GgufTest, RopeFreqsTensorBecomesLlama3Scaling) {
  TempDir dir;
  std::vector<float> factors(std::begin(kLlama32RopeFreqs), std::end(kLlama32RopeFreqs));
  GgufFile gguf = read_gguf(write_rope_freqs_model(dir.str() + "/l32.gguf", factors));
  ModelConfig config = gguf_model_config(gguf);
  EXPECT_EQ(config.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(config.rope_scaling.factor, 32.0f);
  EXPECT_EQ(config.rope_scaling.low_freq_factor, 1.0f);
  EXPECT_EQ(config.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(config.rope_scaling.original_max_position_embeddings, 8192);

  factors[16] = 5.0f;  // not what any llama3 parameters give
  GgufFile odd = read_gguf(write_rope_freqs_model(dir.str() + "/odd.gguf", factors));
  expect_error([&] { gguf_model_config(odd); }, ErrorKind::kUnsupported, {"odd.gguf", "rope_freqs.weight"});
}

TEST(GgufTest, SmolLM2RowsMatchTransformersGgufLoader) {
  const std::string model_path = test::smollm2_gguf_path();
  if (model_path.empty()) GTEST_SKIP() << "SmolLM2 GGUF not present";
  // Rows of transformers' own from_pretrained(gguf_file=...) state dict
  // (tools/formats/make_smollm2_rows.py); the whole model matched with max diff 0.
  GgufFile gguf = read_gguf(model_path);
  TensorMap rows = read_safetensors(test::fixture_path("formats/smollm2_rows.safetensors"));
  const std::map<std::string, std::vector<int>> selection = {
      {"model.embed_tokens.weight", {0, 1, 2, 49151}},
      {"model.layers.0.self_attn.q_proj.weight", {0, 1, 31, 32, 33, 63, 64, 575}},
      {"model.layers.0.self_attn.k_proj.weight", {0, 1, 32, 33, 64, 191}},
      {"model.layers.0.self_attn.v_proj.weight", {0, 191}},
      {"model.layers.29.mlp.down_proj.weight", {0, 575}},
  };
  for (const auto& [name, indices] : selection) {
    SCOPED_TRACE(name);
    const Tensor& got = gguf.tensors.at(name);
    const Tensor& want = rows.at(name);
    const int64_t row_length = got.shape[1];
    ASSERT_EQ(want.shape, (std::vector<int64_t>{static_cast<int64_t>(indices.size()), row_length}));
    for (size_t r = 0; r < indices.size(); ++r)
      EXPECT_EQ(std::memcmp(got.data + indices[r] * row_length, want.data + r * row_length, row_length * 4), 0)
          << "row " << indices[r];
  }
  for (const std::string name : {"model.layers.29.input_layernorm.weight", "model.norm.weight"})
    EXPECT_EQ(values_of(gguf.tensors.at(name)), values_of(rows.at(name))) << name;

  ModelConfig config = gguf_model_config(gguf);
  EXPECT_EQ(config.num_layers, 30);
  EXPECT_EQ(config.hidden_size, 576);
  EXPECT_EQ(config.num_heads, 9);
  EXPECT_EQ(config.num_kv_heads, 3);
  EXPECT_EQ(config.head_dim, 64);
  EXPECT_EQ(config.vocab_size, 49152);
  EXPECT_EQ(config.rope_theta, 100000.0f);
  EXPECT_TRUE(config.tie_word_embeddings);
  EXPECT_EQ(config.bos_token_id, 1);
  EXPECT_EQ(config.eos_token_ids, std::vector<int>{2});
}

// ---- corrupt and unsupported files ----

std::string write_small_model(const std::string& path, uint32_t tensor_type = kQ8_0,
                              const std::string& arch = "llama") {
  GgufWriter writer;
  add_llama_metadata(writer, 32, 1, 1, arch);
  writer.add_tensor("token_embd.weight", {32, 2}, tensor_type, std::string(2 * 34, '\x01'));
  writer.write(path);
  return path;
}

std::string read_bytes(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(stream), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

TEST(GgufTest, BadMagicAndVersion) {
  TempDir dir;
  const std::string path = write_small_model(dir.str() + "/m.gguf");
  std::string bytes = read_bytes(path);
  bytes[0] = 'X';
  write_bytes(path, bytes);
  expect_error([&] { read_gguf(path); }, ErrorKind::kFormat, {path, "magic"});
  write_bytes(path, "GG");
  expect_error([&] { read_gguf(path); }, ErrorKind::kFormat, {path, "magic"});

  bytes[0] = 'G';
  bytes[4] = 1;  // version 1 used 32-bit counts
  write_bytes(path, bytes);
  expect_error([&] { read_gguf(path); }, ErrorKind::kUnsupported, {path, "version 1"});
}

TEST(GgufTest, TruncatedFilesNameWhatIsMissing) {
  TempDir dir;
  const std::string path = write_small_model(dir.str() + "/m.gguf");
  const std::string bytes = read_bytes(path);
  // Cut inside the metadata.
  write_bytes(path, bytes.substr(0, 60));
  expect_error([&] { read_gguf(path); }, ErrorKind::kFormat, {path, "truncated"});
  // Cut inside the tensor data: the error names the tensor.
  write_bytes(path, bytes.substr(0, bytes.size() - 10));
  expect_error([&] { read_gguf(path); }, ErrorKind::kFormat, {path, "token_embd.weight", "beyond"});
}

TEST(GgufTest, TensorOffsetBeyondFile) {
  TempDir dir;
  const std::string path = write_small_model(dir.str() + "/m.gguf");
  std::string bytes = read_bytes(path);
  // The tensor info ends with its u64 offset, just before the header padding.
  const size_t name_at = bytes.find("token_embd.weight");
  const size_t offset_at = name_at + std::strlen("token_embd.weight") + 4 + 2 * 8 + 4;
  const uint64_t huge = 1ull << 40;
  std::memcpy(&bytes[offset_at], &huge, 8);
  write_bytes(path, bytes);
  expect_error([&] { read_gguf(path); }, ErrorKind::kFormat, {path, "token_embd.weight", "beyond"});
}

TEST(GgufTest, UnsupportedTensorTypeNamesTensorAndType) {
  TempDir dir;
  const std::string path = write_small_model(dir.str() + "/k.gguf", kQ3_K);
  expect_error([&] { read_gguf(path); }, ErrorKind::kUnsupported, {path, "token_embd.weight", "Q3_K"});
  expect_error([&] { read_gguf(path, {.keep_quantized = true}); }, ErrorKind::kUnsupported,
               {path, "token_embd.weight", "Q3_K"});
}

TEST(GgufTest, UnsupportedArchitecture) {
  TempDir dir;
  const std::string path = write_small_model(dir.str() + "/gpt2.gguf", kQ8_0, "gpt2");
  expect_error([&] { read_gguf(path); }, ErrorKind::kUnsupported, {path, "gpt2"});
}

TEST(GgufTest, RowLengthNotAMultipleOfTheBlock) {
  TempDir dir;
  GgufWriter writer;
  add_llama_metadata(writer, 32, 1, 1);
  writer.add_tensor("blk.0.ffn_up.weight", {48, 1}, kQ4_0, std::string(36, '\0'));
  writer.write(dir.str() + "/odd.gguf");
  expect_error([&] { read_gguf(dir.str() + "/odd.gguf"); }, ErrorKind::kFormat,
               {"odd.gguf", "blk.0.ffn_up.weight", "block"});
}

TEST(GgufTest, AbsurdCountsAreRejectedBeforeAllocating) {
  TempDir dir;
  GgufWriter writer;
  add_llama_metadata(writer, 32, 1, 1);
  writer.add_raw("tokenizer.ggml.tokens", GgufWriter::kArray,
                 GgufWriter::encode<uint32_t>(GgufWriter::kString) + GgufWriter::encode<uint64_t>(1ull << 60));
  writer.write(dir.str() + "/huge.gguf");
  expect_error([&] { read_gguf(dir.str() + "/huge.gguf"); }, ErrorKind::kFormat,
               {"huge.gguf", "tokenizer.ggml.tokens"});
}

}  // namespace
}  // namespace loom
