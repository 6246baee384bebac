// safetensors reading and writing: round trips, files written by python
// safetensors, sharded checkpoints, and every kind of corrupt input.
#include "formats/safetensors.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "util/error.h"

namespace loom {
namespace {

using test::TempDir;

// Runs `action`, which must throw loom::Error of `kind` whose message contains every needle.
using test::expect_error;

std::vector<float> values_of(const Tensor& tensor) {
  return std::vector<float>(tensor.data, tensor.data + tensor.numel());
}

std::string read_bytes(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(stream), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A file with the given header text and `num_data_bytes` zero bytes of data.
std::string make_file(const std::string& directory, const std::string& name, const std::string& header,
                      size_t num_data_bytes) {
  std::string bytes(8, '\0');
  uint64_t length = header.size();
  std::memcpy(bytes.data(), &length, 8);
  bytes += header;
  bytes.append(num_data_bytes, '\0');
  const std::string path = directory + "/" + name;
  write_bytes(path, bytes);
  return path;
}

TEST(SafetensorsTest, F32RoundTripIsExactSortedAlignedAndTaggedPt) {
  TempDir dir;
  TensorMap tensors;
  tensors["zeta"] = Tensor::from_vector({2, 3}, {1.0f, -2.5f, 3.25f, 0.0f, 1e-30f, -7.0f});
  tensors["alpha"] = Tensor::from_vector({1}, {42.0f});
  tensors["mid"] = Tensor::from_vector({2, 2}, {std::numeric_limits<float>::infinity(), -0.0f, 5e-41f, 1.0f});
  const std::string path = dir.str() + "/model.safetensors";
  write_safetensors(path, tensors, StoredDtype::kF32, {{"origin", "test"}});

  TensorMap loaded = read_safetensors(path);
  ASSERT_EQ(loaded.size(), 3u);
  for (const auto& [name, tensor] : tensors) {
    ASSERT_EQ(loaded.at(name).shape, tensor.shape) << name;
    std::vector<float> got = values_of(loaded.at(name));
    std::vector<float> want = values_of(tensor);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << name;  // bitwise, keeps -0
  }

  const std::string bytes = read_bytes(path);
  uint64_t header_length;
  std::memcpy(&header_length, bytes.data(), 8);
  EXPECT_EQ((8 + header_length) % 8, 0u);
  auto header = nlohmann::json::parse(bytes.substr(8, header_length));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["__metadata__"]["origin"], "test");
  EXPECT_EQ(header["alpha"]["data_offsets"], nlohmann::json({0, 4}));
  EXPECT_EQ(header["mid"]["data_offsets"], nlohmann::json({4, 20}));
  EXPECT_EQ(header["zeta"]["data_offsets"], nlohmann::json({20, 44}));
  EXPECT_EQ(bytes.size(), 8 + header_length + 44);
}

TEST(SafetensorsTest, F32TensorsPointIntoTheMapping) {
  TempDir dir;
  TensorMap tensors;
  tensors["a"] = Tensor::from_vector({4}, {1, 2, 3, 4});
  tensors["b"] = Tensor::from_vector({2}, {5, 6});
  const std::string path = dir.str() + "/m.safetensors";
  write_safetensors(path, tensors);
  TensorMap loaded = read_safetensors(path);
  // Zero copy: both views share one storage (the mapping), 16 bytes apart.
  EXPECT_EQ(loaded.at("a").storage.get(), loaded.at("b").storage.get());
  EXPECT_EQ(loaded.at("b").data - loaded.at("a").data, 4);
}

TEST(SafetensorsTest, F16RoundTripRoundsToNearestEven) {
  TempDir dir;
  TensorMap tensors;
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even -> 1.
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 and 1 + 2^-9: ties to even -> 1 + 2^-9.
  tensors["h"] = Tensor::from_vector(
      {6}, {1.0f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65504.0f, 0x1p-24f, -1e6f});
  const std::string path = dir.str() + "/h.safetensors";
  write_safetensors(path, tensors, StoredDtype::kF16);
  TensorMap loaded = read_safetensors(path);
  EXPECT_EQ(values_of(loaded.at("h")),
            (std::vector<float>{1.0f, 1.0f, 1.0f + 0x1p-9f, 65504.0f, 0x1p-24f,
                                -std::numeric_limits<float>::infinity()}));
  EXPECT_NE(read_bytes(path).find("\"dtype\":\"F16\""), std::string::npos);
}

TEST(SafetensorsTest, Bf16RoundTripRoundsToNearestEven) {
  TempDir dir;
  TensorMap tensors;
  // bf16 keeps 8 significand bits: 1 + 2^-8 ties to 1, 1 + 3 * 2^-8 ties to 1 + 2^-6.
  tensors["b"] = Tensor::from_vector({2, 2}, {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -3.0f, 0x1.8p127f});
  const std::string path = dir.str() + "/b.safetensors";
  write_safetensors(path, tensors, StoredDtype::kBF16);
  TensorMap loaded = read_safetensors(path);
  EXPECT_EQ(loaded.at("b").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(values_of(loaded.at("b")), (std::vector<float>{1.0f, 1.0f + 0x1p-6f, -3.0f, 0x1.8p127f}));
  EXPECT_NE(read_bytes(path).find("\"dtype\":\"BF16\""), std::string::npos);
}

TEST(SafetensorsTest, Keep16BitViewsMatricesInTheMappingAndReadsTheRestAsFp32) {
  TempDir dir;
  TensorMap tensors;
  tensors["m"] = Tensor::from_vector({2, 3}, {1.0f, -2.5f, 0.125f, 3.0f, 1e-3f, -7.0f});
  tensors["v"] = Tensor::from_vector({3}, {0.5f, 1.5f, -1.0f});
  for (StoredDtype dtype : {StoredDtype::kBF16, StoredDtype::kF16}) {
    const std::string path = dir.str() + (dtype == StoredDtype::kBF16 ? "/b.safetensors" : "/h.safetensors");
    write_safetensors(path, tensors, dtype);
    const TensorMap expanded = read_safetensors(path);
    const TensorMap kept = read_safetensors(path, {.keep_16bit = true});
    const Tensor& matrix = kept.at("m");
    ASSERT_TRUE(matrix.is_quantized());
    EXPECT_EQ(matrix.data, nullptr);
    EXPECT_EQ(matrix.shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(matrix.quantized.ggml_type, dtype == StoredDtype::kBF16 ? 30u : 1u);  // GgmlType kBF16 / kF16
    EXPECT_EQ(matrix.quantized.row_bytes, 6);
    EXPECT_EQ(values_of(to_fp32(matrix)), values_of(expanded.at("m")));
    EXPECT_FALSE(kept.at("v").is_quantized());  // 1-D: fp32 as before
    EXPECT_EQ(values_of(kept.at("v")), values_of(expanded.at("v")));
  }
  // F32 files are read as always.
  write_safetensors(dir.str() + "/f.safetensors", tensors, StoredDtype::kF32);
  EXPECT_FALSE(read_safetensors(dir.str() + "/f.safetensors", {.keep_16bit = true}).at("m").is_quantized());
}

TEST(SafetensorsTest, ReadsFileWrittenByPythonSafetensors) {
  // tools/formats/make_format_fixtures.py: torch tensors saved by safetensors.torch.
  TensorMap loaded = read_safetensors(test::fixture_path("formats/python_written.safetensors"));
  ASSERT_EQ(loaded.size(), 3u);
  EXPECT_EQ(loaded.at("f32").shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(values_of(loaded.at("f32")), (std::vector<float>{1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, -7.0f}));
  EXPECT_EQ(values_of(loaded.at("f16")), (std::vector<float>{1.0f, -0.5f, 65504.0f, 0x1p-24f}));
  EXPECT_EQ(loaded.at("bf16").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(values_of(loaded.at("bf16")), (std::vector<float>{1.0f, -3.0f, 0.15625f, 0x1.8p127f}));
}

TEST(SafetensorsTest, ShardedCheckpointReadsEveryShard) {
  TempDir dir;
  TensorMap first, second;
  first["model.a"] = Tensor::from_vector({2}, {1, 2});
  second["model.b"] = Tensor::from_vector({1, 3}, {3, 4, 5});
  second["model.c"] = Tensor::from_vector({1}, {6});
  write_safetensors(dir.str() + "/model-00001-of-00002.safetensors", first, StoredDtype::kBF16);
  write_safetensors(dir.str() + "/model-00002-of-00002.safetensors", second);
  nlohmann::json index = {{"metadata", {{"total_size", 24}}},
                          {"weight_map",
                           {{"model.a", "model-00001-of-00002.safetensors"},
                            {"model.b", "model-00002-of-00002.safetensors"},
                            {"model.c", "model-00002-of-00002.safetensors"}}}};
  write_bytes(dir.str() + "/model.safetensors.index.json", index.dump());

  TensorMap loaded = read_safetensors_checkpoint(dir.str());
  ASSERT_EQ(loaded.size(), 3u);
  EXPECT_EQ(values_of(loaded.at("model.a")), (std::vector<float>{1, 2}));
  EXPECT_EQ(values_of(loaded.at("model.b")), (std::vector<float>{3, 4, 5}));
  EXPECT_EQ(values_of(loaded.at("model.c")), (std::vector<float>{6}));
}

TEST(SafetensorsTest, ShardedCheckpointErrorsNameShardAndTensor) {
  TempDir dir;
  TensorMap first;
  first["model.a"] = Tensor::from_vector({2}, {1, 2});
  write_safetensors(dir.str() + "/shard-1.safetensors", first);
  const std::string index_path = dir.str() + "/model.safetensors.index.json";

  write_bytes(index_path, nlohmann::json({{"weight_map", {{"model.a", "shard-1.safetensors"},
                                                           {"model.z", "shard-2.safetensors"}}}})
                              .dump());
  expect_error([&] { read_safetensors_checkpoint(dir.str()); }, ErrorKind::kNotFound,
               {"shard-2.safetensors", "model.safetensors.index.json"});

  write_bytes(index_path, nlohmann::json({{"weight_map", {{"model.a", "shard-1.safetensors"},
                                                           {"model.q", "shard-1.safetensors"}}}})
                              .dump());
  expect_error([&] { read_safetensors_checkpoint(dir.str()); }, ErrorKind::kFormat,
               {"model.safetensors.index.json", "model.q", "shard-1.safetensors"});

  write_bytes(index_path, "{\"weight_map\": ");
  expect_error([&] { read_safetensors_checkpoint(dir.str()); }, ErrorKind::kFormat,
               {"model.safetensors.index.json"});

  TempDir empty;
  expect_error([&] { read_safetensors_checkpoint(empty.str()); }, ErrorKind::kNotFound,
               {empty.str(), "model.safetensors"});
}

TEST(SafetensorsTest, TruncatedFiles) {
  TempDir dir;
  const std::string tiny = dir.str() + "/tiny.safetensors";
  write_bytes(tiny, std::string(5, '\0'));
  expect_error([&] { read_safetensors(tiny); }, ErrorKind::kFormat, {tiny, "truncated"});

  // A good file cut one byte short: the last tensor's data no longer fits.
  TensorMap tensors;
  tensors["a"] = Tensor::from_vector({2}, {1, 2});
  tensors["b"] = Tensor::from_vector({2}, {3, 4});
  const std::string cut = dir.str() + "/cut.safetensors";
  write_safetensors(cut, tensors);
  std::string bytes = read_bytes(cut);
  write_bytes(cut, bytes.substr(0, bytes.size() - 1));
  expect_error([&] { read_safetensors(cut); }, ErrorKind::kFormat, {cut, "tensor b", "out of range"});
}

TEST(SafetensorsTest, HeaderLengthBeyondFile) {
  TempDir dir;
  std::string bytes(8, '\0');
  uint64_t length = 1000;
  std::memcpy(bytes.data(), &length, 8);
  bytes += "{}";
  const std::string path = dir.str() + "/long.safetensors";
  write_bytes(path, bytes);
  expect_error([&] { read_safetensors(path); }, ErrorKind::kFormat, {path, "header length 1000"});
}

TEST(SafetensorsTest, BadJson) {
  TempDir dir;
  const std::string path = make_file(dir.str(), "bad.safetensors", "{\"a\": {\"dtype\": ", 0);
  expect_error([&] { read_safetensors(path); }, ErrorKind::kFormat, {path, "JSON"});
  const std::string list = make_file(dir.str(), "list.safetensors", "[1, 2]", 0);
  expect_error([&] { read_safetensors(list); }, ErrorKind::kFormat, {list, "object"});
}

TEST(SafetensorsTest, MalformedEntriesNameTheTensor) {
  TempDir dir;
  struct Case {
    std::string header;
    size_t num_data_bytes;
    ErrorKind kind;
    std::string needle;
  };
  const Case cases[] = {
      // offsets beyond the data section
      {R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}})", 8, ErrorKind::kFormat, "out of range"},
      // begin after end
      {R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", 8, ErrorKind::kFormat, "out of range"},
      // size does not match dtype x shape
      {R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8, ErrorKind::kFormat, "needs 12 bytes"},
      {R"({"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 16]}})", 16, ErrorKind::kFormat, "needs 8 bytes"},
      // overlapping tensors
      {R"({"v": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "w": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12, ErrorKind::kFormat, "overlap"},
      // negative or non-integer dimension, missing fields, unknown dtype
      {R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4, ErrorKind::kFormat, "shape"},
      {R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4, ErrorKind::kFormat, "shape"},
      {R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 4, ErrorKind::kFormat, "dtype"},
      {R"({"w": {"dtype": "F32", "shape": [1]}})", 4, ErrorKind::kFormat, "data_offsets"},
      {R"({"w": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}})", 4, ErrorKind::kFormat, "F99"},
      // a shape whose byte count overflows 64 bits must not wrap around to the span
      {R"({"w": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 0]}})", 0,
       ErrorKind::kFormat, "needs"},
      // well-formed but a dtype we do not load
      {R"({"w": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", 8, ErrorKind::kUnsupported, "I64"},
  };
  int index = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    const std::string path = make_file(dir.str(), "case" + std::to_string(index++) + ".safetensors", c.header,
                                       c.num_data_bytes);
    expect_error([&] { read_safetensors(path); }, c.kind, {path, "tensor w", c.needle});
  }
}

TEST(SafetensorsTest, MissingFileIsNotFound) {
  expect_error([&] { read_safetensors("/nonexistent/dir/model.safetensors"); }, ErrorKind::kNotFound,
               {"/nonexistent/dir/model.safetensors"});
}

}  // namespace
}  // namespace loom
