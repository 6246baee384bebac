// safetensors writer: what python `safetensors` and transformers load.
//
// The reference loader insists that tensors tile the data section exactly (no
// gaps), so alignment comes from padding the JSON header with spaces until the
// data section starts at a multiple of 8, and from laying tensors out by
// element size, largest first (as safetensors' own writer does): every tensor
// then starts at a multiple of its element size.
#include <algorithm>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "util/error.h"
#include "util/fp8.h"
#include "util/half.h"
#include "util/progress.h"

namespace loom {

namespace {

const char* dtype_name(StoredDtype dtype) {
  switch (dtype) {
    case StoredDtype::kF32: return "F32";
    case StoredDtype::kF16: return "F16";
    case StoredDtype::kBF16: return "BF16";
    case StoredDtype::kF8E4M3: return "F8_E4M3";
  }
  return "F32";
}

int dtype_num_bytes(StoredDtype dtype) {
  switch (dtype) {
    case StoredDtype::kF32: return 4;
    case StoredDtype::kF16:
    case StoredDtype::kBF16: return 2;
    case StoredDtype::kF8E4M3: return 1;
  }
  return 4;
}

// Elements stored: numel(), or 1 for a 0-dimensional tensor with a value.
int64_t num_stored_elements(const Tensor& tensor) {
  return tensor.shape.empty() ? (tensor.data != nullptr ? 1 : 0) : tensor.numel();
}

// e4m3 rows written as they are: row by row when the rows are strided (a column slice).
void write_fp8_rows(std::ofstream& stream, const Tensor& tensor) {
  const int64_t rows = tensor.shape[0], columns = tensor.shape[1];
  if (tensor.quantized.row_bytes == columns) {
    stream.write(reinterpret_cast<const char*>(tensor.quantized.bytes), rows * columns);
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    stream.write(reinterpret_cast<const char*>(tensor.quantized.bytes + r * tensor.quantized.row_bytes), columns);
}

void write_values(std::ofstream& stream, const Tensor& source, StoredDtype dtype) {
  if (source.is_fp8() && dtype == StoredDtype::kF8E4M3) {  // the bytes; scales are tensors of their own
    write_fp8_rows(stream, source);
    return;
  }
  const Tensor tensor = to_fp32(source);
  const int64_t num_elements = num_stored_elements(tensor);
  if (dtype == StoredDtype::kF32) {
    stream.write(reinterpret_cast<const char*>(tensor.data), num_elements * 4);
    return;
  }
  constexpr int64_t kChunk = 1 << 16;
  std::vector<uint16_t> buffer(kChunk);
  std::vector<uint8_t> bytes(kChunk);
  for (int64_t start = 0; start < num_elements; start += kChunk) {
    const int64_t count = std::min(kChunk, num_elements - start);
    if (dtype == StoredDtype::kF8E4M3) {
      for (int64_t i = 0; i < count; ++i) bytes[i] = float_to_e4m3(tensor.data[start + i]);
      stream.write(reinterpret_cast<const char*>(bytes.data()), count);
      continue;
    }
    for (int64_t i = 0; i < count; ++i)
      buffer[i] = dtype == StoredDtype::kF16 ? float_to_fp16(tensor.data[start + i])
                                             : float_to_bf16(tensor.data[start + i]);
    stream.write(reinterpret_cast<const char*>(buffer.data()), count * 2);
  }
}

}  // namespace

void write_safetensors(const std::string& path, const TensorMap& tensors, StoredDtype dtype,
                       const std::map<std::string, std::string>& metadata,
                       const std::map<std::string, StoredDtype>& dtypes) {
  std::map<std::string, StoredDtype> stored;
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__") fail(ErrorKind::kInvalidArgument, "{}: reserved tensor name {}", path, name);
    if (tensor.empty() && tensor.numel() > 0)
      fail(ErrorKind::kInvalidArgument, "{}: tensor {} has no data", path, name);
    auto named = dtypes.find(name);
    stored[name] = named != dtypes.end() ? named->second : tensor.is_fp8() ? StoredDtype::kF8E4M3 : dtype;
  }
  for (const auto& [name, ignored] : dtypes)
    if (tensors.count(name) == 0) fail(ErrorKind::kInvalidArgument, "{}: a dtype is given for tensor {}, which is not written", path, name);
  std::vector<std::string> names;
  for (const auto& [name, ignored] : stored) names.push_back(name);
  std::stable_sort(names.begin(), names.end(), [&](const std::string& a, const std::string& b) {
    return dtype_num_bytes(stored[a]) > dtype_num_bytes(stored[b]);
  });

  auto num_bytes_of = [&](const std::string& name) {
    return static_cast<uint64_t>(num_stored_elements(tensors.at(name))) * dtype_num_bytes(stored[name]);
  };
  nlohmann::json header = nlohmann::json::object();
  nlohmann::json metadata_json = nlohmann::json::object();
  metadata_json["format"] = "pt";  // transformers refuses files without it
  for (const auto& [key, value] : metadata) metadata_json[key] = value;
  header["__metadata__"] = metadata_json;
  uint64_t offset = 0;
  for (const std::string& name : names) {
    const uint64_t num_bytes = num_bytes_of(name);
    header[name] = {{"dtype", dtype_name(stored[name])},
                    {"shape", tensors.at(name).shape},
                    {"data_offsets", {offset, offset + num_bytes}}};
    offset += num_bytes;
  }
  std::string header_text = header.dump();
  header_text.append((8 - (8 + header_text.size()) % 8) % 8, ' ');

  std::ofstream stream(path, std::ios::binary | std::ios::trunc);
  if (!stream) fail(ErrorKind::kInvalidArgument, "cannot create {}", path);
  uint8_t length_bytes[8];
  uint64_t length = header_text.size();
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<uint8_t>(length >> (8 * i));
  stream.write(reinterpret_cast<const char*>(length_bytes), 8);
  stream.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));
  Progress progress("writing " + path, static_cast<int64_t>(offset));
  for (const std::string& name : names) {
    write_values(stream, tensors.at(name), stored[name]);
    progress.advance(static_cast<int64_t>(num_bytes_of(name)));
  }
  stream.flush();
  if (!stream) fail(ErrorKind::kInvalidArgument, "{}: write failed (disk full?)", path);
}

}  // namespace loom
