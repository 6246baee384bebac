// safetensors writer: what python `safetensors` and transformers load.
//
// The reference loader insists that tensors tile the data section exactly (no
// gaps), so alignment comes from padding the JSON header with spaces until the
// data section starts at a multiple of 8; every tensor then starts at a multiple
// of its element size because all tensors share one dtype.
#include <algorithm>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "formats/safetensors.h"
#include "util/error.h"
#include "util/half.h"
#include "util/progress.h"

namespace loom {

namespace {

const char* dtype_name(StoredDtype dtype) {
  switch (dtype) {
    case StoredDtype::kF32: return "F32";
    case StoredDtype::kF16: return "F16";
    case StoredDtype::kBF16: return "BF16";
  }
  return "F32";
}

int dtype_num_bytes(StoredDtype dtype) { return dtype == StoredDtype::kF32 ? 4 : 2; }

void write_values(std::ofstream& stream, const Tensor& tensor, StoredDtype dtype) {
  const int64_t num_elements = tensor.numel();
  if (dtype == StoredDtype::kF32) {
    stream.write(reinterpret_cast<const char*>(tensor.data), num_elements * 4);
    return;
  }
  constexpr int64_t kChunk = 1 << 16;
  std::vector<uint16_t> buffer(kChunk);
  for (int64_t start = 0; start < num_elements; start += kChunk) {
    const int64_t count = std::min(kChunk, num_elements - start);
    for (int64_t i = 0; i < count; ++i)
      buffer[i] = dtype == StoredDtype::kF16 ? float_to_fp16(tensor.data[start + i])
                                             : float_to_bf16(tensor.data[start + i]);
    stream.write(reinterpret_cast<const char*>(buffer.data()), count * 2);
  }
}

}  // namespace

void write_safetensors(const std::string& path, const TensorMap& tensors, StoredDtype dtype,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<std::string> names;
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__") fail(ErrorKind::kInvalidArgument, "{}: reserved tensor name {}", path, name);
    if (tensor.data == nullptr && tensor.numel() > 0)
      fail(ErrorKind::kInvalidArgument, "{}: tensor {} has no data", path, name);
    names.push_back(name);
  }
  std::sort(names.begin(), names.end());

  nlohmann::json header = nlohmann::json::object();
  nlohmann::json metadata_json = nlohmann::json::object();
  metadata_json["format"] = "pt";  // transformers refuses files without it
  for (const auto& [key, value] : metadata) metadata_json[key] = value;
  header["__metadata__"] = metadata_json;
  uint64_t offset = 0;
  for (const std::string& name : names) {
    const Tensor& tensor = tensors.at(name);
    const uint64_t num_bytes = static_cast<uint64_t>(tensor.numel()) * dtype_num_bytes(dtype);
    header[name] = {{"dtype", dtype_name(dtype)},
                    {"shape", tensor.shape},
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
  int64_t total = 0;
  for (const std::string& name : names) total += tensors.at(name).numel() * dtype_num_bytes(dtype);
  Progress progress("writing " + path, total);
  for (const std::string& name : names) {
    write_values(stream, tensors.at(name), dtype);
    progress.advance(tensors.at(name).numel() * dtype_num_bytes(dtype));
  }
  stream.flush();
  if (!stream) fail(ErrorKind::kInvalidArgument, "{}: write failed (disk full?)", path);
}

}  // namespace loom
