// FP8 e4m3 (util/fp8.h) against its definition on every bit pattern, the
// encoder's rounding, and safetensors' F8_E4M3 tensors (formats/): read as rows
// viewed in the file, written as they are, mixed with other dtypes, scalars,
// to_fp32 with row scales, E5M2 refused.
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "formats/gguf_dequant.h"
#include "formats/safetensors.h"
#include "test_util.h"
#include "util/fp8.h"
#include "util/prng.h"

namespace loom {
namespace {

using test::expect_error;
using test::TempDir;

// The value of an e4m3 bit pattern straight from the format's definition, in
// double: sign, 4 exponent bits biased by 7, 3 mantissa bits; exponent 0 is
// subnormal; S.1111.111 is NaN; no infinities.
double e4m3_definition(int bits) {
  const int sign = (bits >> 7) & 1;
  const int exponent = (bits >> 3) & 15;
  const int mantissa = bits & 7;
  if (exponent == 15 && mantissa == 7) return std::numeric_limits<double>::quiet_NaN();
  const double magnitude = exponent == 0 ? std::ldexp(mantissa / 8.0, 1 - 7)
                                         : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}

TEST(Fp8Test, DecodesEveryBitPatternAsTheDefinitionSays) {
  int num_nan = 0;
  for (int bits = 0; bits < 256; ++bits) {
    const double expected = e4m3_definition(bits);
    const float decoded = e4m3_to_float(static_cast<uint8_t>(bits));
    EXPECT_EQ(e4m3_is_nan(static_cast<uint8_t>(bits)), std::isnan(expected)) << "bits " << bits;
    if (std::isnan(expected)) {
      ++num_nan;
      EXPECT_TRUE(std::isnan(decoded)) << "bits " << bits;
      continue;
    }
    EXPECT_FALSE(std::isinf(decoded)) << "bits " << bits;
    EXPECT_EQ(static_cast<double>(decoded), expected) << "bits " << bits;
    EXPECT_EQ(std::signbit(decoded), (bits & 0x80) != 0) << "bits " << bits;  // -0 included
  }
  EXPECT_EQ(num_nan, 2);  // 0x7F and 0xFF only
  // Landmarks: the largest finite, the smallest normal and subnormal.
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
}

TEST(Fp8Test, EncodingRoundTripsEveryFiniteValue) {
  for (int bits = 0; bits < 256; ++bits) {
    if (e4m3_is_nan(static_cast<uint8_t>(bits))) continue;
    EXPECT_EQ(float_to_e4m3(e4m3_to_float(static_cast<uint8_t>(bits))), bits) << "bits " << bits;
  }
}

// The encoder against a search over all finite values: nearest, ties to the
// even mantissa, saturating beyond 448, NaN to NaN.
TEST(Fp8Test, EncodingRoundsToNearestEvenAndSaturates) {
  auto nearest = [](float value) {
    int best = -1;
    double best_distance = 0;
    for (int bits = 0; bits < 256; ++bits) {
      const double candidate = e4m3_definition(bits);
      if (std::isnan(candidate) || std::signbit(candidate) != std::signbit(value)) continue;
      const double distance = std::abs(candidate - static_cast<double>(value));
      if (best < 0 || distance < best_distance || (distance == best_distance && (bits & 1) == 0)) {
        best = bits;
        best_distance = distance;
      }
    }
    return best;
  };
  Prng prng(7);
  for (int i = 0; i < 20000; ++i) {
    // Magnitudes from 2^-12 to 2^9 (subnormals, normals and the saturating range), both signs.
    const float exponent = -12.0f + 21.0f * (0.5f + 0.5f * prng.next_symmetric_float());
    const float value = std::copysign(std::exp2(exponent), prng.next_symmetric_float());
    if (std::abs(value) >= 448.0f) {
      EXPECT_EQ(float_to_e4m3(value), value > 0 ? 0x7E : 0xFE) << value;
      continue;
    }
    ASSERT_EQ(float_to_e4m3(value), nearest(value)) << value;
  }
  // Exact midpoints: 1 + 1/16 lies between 0x38 (even) and 0x39; 1 + 3/16 between 0x39 and 0x3A (even).
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3A);
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.5f, -9)), 0x02);  // subnormal midpoint 1.5 steps: to 2 (even)
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(float_to_e4m3(-1e30f), 0xFE);
  EXPECT_TRUE(e4m3_is_nan(float_to_e4m3(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
}

std::shared_ptr<std::vector<uint8_t>> all_patterns_but_nan(int64_t count) {
  auto bytes = std::make_shared<std::vector<uint8_t>>(count);
  for (int64_t i = 0; i < count; ++i) {
    uint8_t bits = static_cast<uint8_t>((i * 37 + 11) % 256);
    if (e4m3_is_nan(bits)) bits = 0x3F;
    (*bytes)[i] = bits;
  }
  return bytes;
}

Tensor fp8_rows(std::vector<int64_t> shape, const std::shared_ptr<std::vector<uint8_t>>& bytes) {
  Tensor tensor;
  tensor.shape = std::move(shape);
  tensor.quantized.ggml_type = kF8E4M3RowType;
  tensor.quantized.bytes = bytes->data();
  tensor.quantized.row_bytes = tensor.shape[1];
  tensor.storage = bytes;
  return tensor;
}

TEST(Fp8SafetensorsTest, F8E4M3RoundTripsBesideOtherDtypesAndScalars) {
  TempDir dir;
  const auto bytes = all_patterns_but_nan(5 * 7);
  TensorMap tensors;
  tensors["a.weight"] = fp8_rows({5, 7}, bytes);
  tensors["a.weight_scale"] = Tensor::from_vector({5, 1}, {0.5f, 1.0f, 2.0f, 0.25f, 3.0f});
  tensors["a.input_scale"] = Tensor::scalar(0.125f);
  tensors["b.weight"] = Tensor::from_vector({1, 3}, {1.0f, -2.0f, 3.0f});
  tensors["c.values"] = Tensor::from_vector({2, 2}, {1.0f, 448.0f, 1000.0f, -0.0078125f});
  const std::string path = dir.str() + "/model.safetensors";
  write_safetensors(path, tensors, StoredDtype::kF32, {},
                    {{"b.weight", StoredDtype::kBF16}, {"c.values", StoredDtype::kF8E4M3}});

  // The header: each tensor in its dtype, laid out by element size (F32, then BF16, then F8), each aligned to it.
  std::ifstream stream(path, std::ios::binary);
  uint64_t header_size = 0;
  stream.read(reinterpret_cast<char*>(&header_size), 8);
  std::string header_text(header_size, '\0');
  stream.read(header_text.data(), static_cast<std::streamsize>(header_size));
  const nlohmann::json header = nlohmann::json::parse(header_text);
  EXPECT_EQ(header["a.weight"]["dtype"], "F8_E4M3");
  EXPECT_EQ(header["c.values"]["dtype"], "F8_E4M3");
  EXPECT_EQ(header["b.weight"]["dtype"], "BF16");
  EXPECT_EQ(header["a.input_scale"]["dtype"], "F32");
  EXPECT_EQ(header["a.input_scale"]["shape"], nlohmann::json::array());
  EXPECT_EQ(header["a.input_scale"]["data_offsets"][1].get<int>() - header["a.input_scale"]["data_offsets"][0].get<int>(), 4);
  EXPECT_EQ((8 + header_size) % 8, 0u);
  for (const char* name : {"a.input_scale", "a.weight_scale"}) EXPECT_EQ(header[name]["data_offsets"][0].get<int>() % 4, 0);
  EXPECT_EQ(header["b.weight"]["data_offsets"][0].get<int>() % 2, 0);
  EXPECT_LT(header["a.weight_scale"]["data_offsets"][0].get<int>(), header["b.weight"]["data_offsets"][0].get<int>());
  EXPECT_LT(header["b.weight"]["data_offsets"][0].get<int>(), header["a.weight"]["data_offsets"][0].get<int>());

  // Without keep_fp8 (an adapter, a plain read) e4m3 is decoded to fp32, unscaled.
  const TensorMap decoded = read_safetensors(path);
  ASSERT_FALSE(decoded.at("a.weight").is_quantized());
  for (int64_t i = 0; i < 35; ++i)
    EXPECT_EQ(decoded.at("a.weight").data[i], static_cast<float>(e4m3_definition((*bytes)[i])));

  const TensorMap read = read_safetensors(path, {.keep_fp8 = true});
  const Tensor& weight = read.at("a.weight");
  ASSERT_TRUE(weight.is_fp8());
  EXPECT_EQ(weight.data, nullptr);
  EXPECT_EQ(weight.shape, (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(weight.quantized.row_bytes, 7);
  EXPECT_EQ(weight.quantized.fp8.rows, nullptr);  // scales are attached by the model, not the reader
  EXPECT_EQ(std::vector<uint8_t>(weight.quantized.bytes, weight.quantized.bytes + 35), *bytes);
  EXPECT_EQ(ggml_type_name(weight.quantized.ggml_type), "F8_E4M3");
  EXPECT_FALSE(is_supported_ggml_type(weight.quantized.ggml_type));
  const Tensor& input_scale = read.at("a.input_scale");
  EXPECT_TRUE(input_scale.shape.empty());
  ASSERT_NE(input_scale.data, nullptr);
  EXPECT_EQ(input_scale.data[0], 0.125f);
  const Tensor& bf16 = read.at("b.weight");
  EXPECT_EQ(std::vector<float>(bf16.data, bf16.data + 3), (std::vector<float>{1.0f, -2.0f, 3.0f}));
  // fp32 values stored as F8_E4M3: rounded, saturated (1000 -> 448).
  const Tensor values = to_fp32(read.at("c.values"));
  EXPECT_EQ(std::vector<float>(values.data, values.data + 4), (std::vector<float>{1.0f, 448.0f, 448.0f, -0.0078125f}));

  // to_fp32: decoded, and multiplied by row scales once attached.
  const Tensor unscaled = to_fp32(weight);
  Tensor scaled_view = weight;
  auto scales = std::make_shared<std::vector<float>>(std::vector<float>{0.5f, 1.0f, 2.0f, 0.25f, 3.0f});
  scaled_view.quantized.fp8.rows = scales->data();
  scaled_view.quantized.fp8.storage = scales;
  const Tensor scaled = to_fp32(scaled_view);
  for (int64_t r = 0; r < 5; ++r)
    for (int64_t c = 0; c < 7; ++c) {
      const float decoded = static_cast<float>(e4m3_definition((*bytes)[r * 7 + c]));
      EXPECT_EQ(unscaled.data[r * 7 + c], decoded);
      EXPECT_EQ(scaled.data[r * 7 + c], decoded * (*scales)[r]) << r << "," << c;
    }
}

TEST(Fp8SafetensorsTest, OtherF8ShapesAreDecodedAndE5M2IsRefused) {
  TempDir dir;
  const std::string path = dir.str() + "/vector.safetensors";
  {
    TensorMap tensors;
    tensors["v"] = Tensor::from_vector({4}, {1.0f, -2.0f, 0.5f, 448.0f});
    write_safetensors(path, tensors, StoredDtype::kF8E4M3);
  }
  const TensorMap read = read_safetensors(path, {.keep_fp8 = true});  // not a matrix: decoded all the same
  ASSERT_FALSE(read.at("v").is_quantized());
  EXPECT_EQ(std::vector<float>(read.at("v").data, read.at("v").data + 4), (std::vector<float>{1.0f, -2.0f, 0.5f, 448.0f}));

  // The same bytes declared F8_E5M2: refused by name.
  std::string bytes;
  {
    std::ifstream stream(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(stream), {});
  }
  const size_t at = bytes.find("F8_E4M3");
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at, 7, "F8_E5M2");
  const std::string e5m2 = dir.str() + "/e5m2.safetensors";
  std::ofstream(e5m2, std::ios::binary) << bytes;
  expect_error([&] { read_safetensors(e5m2); }, ErrorKind::kUnsupported, {"e5m2.safetensors", "tensor v", "F8_E5M2", "e4m3"});
}

TEST(Fp8SafetensorsTest, NanBytesAreAnErrorWhenDequantized) {
  auto bytes = std::make_shared<std::vector<uint8_t>>(std::vector<uint8_t>{0x38, 0x38, 0x38, 0xFF, 0x38, 0x38});
  expect_error([&] { to_fp32(fp8_rows({3, 2}, bytes)); }, ErrorKind::kFormat, {"NaN", "row 1"});
  (*bytes)[3] = 0x7F;
  expect_error([&] { to_fp32(fp8_rows({3, 2}, bytes)); }, ErrorKind::kFormat, {"NaN", "row 1"});
  (*bytes)[3] = 0x7E;
  EXPECT_EQ(to_fp32(fp8_rows({3, 2}, bytes)).data[3], 448.0f);
}

}  // namespace
}  // namespace loom
