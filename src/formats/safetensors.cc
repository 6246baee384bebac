// safetensors reader. The writer lives in safetensors_writer.cc.
#include "formats/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string_view>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "formats/gguf_dequant.h"
#include "util/error.h"
#include "util/fp8.h"
#include "util/half.h"
#include "util/json_nesting.h"
#include "util/mapped_file.h"

namespace loom {

namespace {

// Same bound as the reference implementation: a header above it is corrupt.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
// Bounds on a tensor's shape, far beyond any checkpoint (numel() stays in int64).
constexpr size_t kMaxDims = 8;
constexpr uint64_t kMaxElements = 1ull << 48;

struct DtypeInfo {
  const char* name;
  int num_bytes;
};

constexpr DtypeInfo kKnownDtypes[] = {
    {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2},
    {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},    {"U32", 4},     {"F32", 4},
    {"F64", 8},  {"I64", 8}, {"U64", 8},
};

int dtype_num_bytes(const std::string& dtype) {
  for (const auto& info : kKnownDtypes)
    if (dtype == info.name) return info.num_bytes;
  return 0;
}

struct TensorEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

uint64_t read_u64_le(const uint8_t* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

TensorEntry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& info,
                        uint64_t data_size) {
  TensorEntry entry;
  entry.name = name;
  if (!info.is_object())
    fail(ErrorKind::kFormat, "{}: tensor {}: header entry is not an object", path, name);
  auto dtype = info.find("dtype");
  auto shape = info.find("shape");
  auto offsets = info.find("data_offsets");
  if (dtype == info.end() || !dtype->is_string())
    fail(ErrorKind::kFormat, "{}: tensor {}: missing or non-string \"dtype\"", path, name);
  if (shape == info.end() || !shape->is_array())
    fail(ErrorKind::kFormat, "{}: tensor {}: missing or non-array \"shape\"", path, name);
  if (offsets == info.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned())
    fail(ErrorKind::kFormat, "{}: tensor {}: \"data_offsets\" must be two non-negative integers", path,
         name);
  entry.dtype = dtype->get<std::string>();
  const int element_bytes = dtype_num_bytes(entry.dtype);
  if (element_bytes == 0)
    fail(ErrorKind::kFormat, "{}: tensor {}: unknown dtype \"{}\"", path, name, entry.dtype);

  // Saturating product: a corrupt shape must not overflow into a small size.
  // The dimensions other than zeros must multiply to a sane count too: an empty
  // tensor [0, 2^62, 2^62] needs no bytes, but Tensor::numel() would overflow.
  unsigned __int128 num_elements = 1, nonzero_product = 1;
  const unsigned __int128 saturation = static_cast<unsigned __int128>(1) << 64;
  if (shape->size() > kMaxDims)
    fail(ErrorKind::kFormat, "{}: tensor {}: shape has {} dimensions (at most {})", path, name, shape->size(),
         kMaxDims);
  for (const auto& dim : *shape) {
    if (!dim.is_number_unsigned())
      fail(ErrorKind::kFormat, "{}: tensor {}: shape {} has a non-integer or negative dimension", path,
           name, shape->dump());
    uint64_t size = dim.get<uint64_t>();
    entry.shape.push_back(static_cast<int64_t>(size));  // each <= kMaxElements once all checks pass
    num_elements = std::min(num_elements * size, saturation);
    if (size != 0) nonzero_product = std::min(nonzero_product * size, saturation);
  }
  const unsigned __int128 needed_bytes = num_elements * static_cast<unsigned>(element_bytes);
  entry.begin = (*offsets)[0].get<uint64_t>();
  entry.end = (*offsets)[1].get<uint64_t>();
  if (entry.begin > entry.end || entry.end > data_size)
    fail(ErrorKind::kFormat,
         "{}: tensor {}: data_offsets [{}, {}] out of range (data section holds {} bytes)", path, name,
         entry.begin, entry.end, data_size);
  if (entry.end - entry.begin != needed_bytes)
    fail(ErrorKind::kFormat,
         "{}: tensor {}: data_offsets span {} bytes but dtype {} x shape [{}] needs {} bytes", path,
         name, entry.end - entry.begin, entry.dtype, fmt::join(entry.shape, ", "),
         static_cast<double>(needed_bytes));
  if (nonzero_product > kMaxElements)
    fail(ErrorKind::kFormat, "{}: tensor {}: shape {} is implausibly large", path, name, shape->dump());
  return entry;
}

// Converts 16-bit floats in parallel: an 8B bf16 checkpoint is 16 GB.
template <typename Convert>
std::shared_ptr<std::vector<float>> convert_16bit(const uint8_t* source, size_t num_elements,
                                                  Convert convert) {
  auto values = std::make_shared<std::vector<float>>(num_elements);
  float* out = values->data();
#pragma omp parallel for schedule(static) if (num_elements > (1u << 20))
  for (size_t i = 0; i < num_elements; ++i) {
    uint16_t bits;
    std::memcpy(&bits, source + 2 * i, sizeof(bits));
    out[i] = convert(bits);
  }
  return values;
}

Tensor make_tensor(const std::string& path, const TensorEntry& entry, const uint8_t* data_section,
                   const std::shared_ptr<const MappedFile>& file, const SafetensorsReadOptions& options) {
  const uint8_t* source = data_section + entry.begin;
  const uint64_t num_bytes = entry.end - entry.begin;
  Tensor tensor;
  tensor.shape = entry.shape;
  const bool is_16bit = entry.dtype == "F16" || entry.dtype == "BF16";
  if (options.keep_16bit && is_16bit && entry.shape.size() == 2 && entry.shape[0] > 0 && entry.shape[1] > 0) {
    tensor.quantized.ggml_type = static_cast<uint32_t>(entry.dtype == "F16" ? GgmlType::kF16 : GgmlType::kBF16);
    tensor.quantized.row_bytes = entry.shape[1] * 2;
    if (reinterpret_cast<uintptr_t>(source) % 2 == 0) {
      tensor.quantized.bytes = source;
      tensor.storage = file;
    } else {  // an odd header length: copy rather than misalign the 16-bit values
      auto bytes = std::make_shared<std::vector<uint8_t>>(source, source + num_bytes);
      tensor.quantized.bytes = bytes->data();
      tensor.storage = std::move(bytes);
    }
    return tensor;
  }
  if (entry.dtype == "F8_E4M3") {
    if (options.keep_fp8 && entry.shape.size() == 2 && entry.shape[0] > 0 && entry.shape[1] > 0) {  // viewed in place
      tensor.quantized.ggml_type = kF8E4M3RowType;
      tensor.quantized.row_bytes = entry.shape[1];
      tensor.quantized.bytes = source;
      tensor.storage = file;
      return tensor;
    }
    auto values = std::make_shared<std::vector<float>>(num_bytes);  // anything else: decoded, unscaled
    for (uint64_t i = 0; i < num_bytes; ++i) (*values)[i] = e4m3_to_float(source[i]);
    tensor.data = values->data();
    tensor.storage = std::move(values);
    return tensor;
  }
  if (entry.dtype == "F8_E5M2")
    throw Error(ErrorKind::kUnsupported,
                fmt::format("{}: tensor {}: dtype F8_E5M2 is not supported", path, entry.name),
                "Loom reads FP8 weights in e4m3 (F8_E4M3), as llm-compressor (compressed-tensors) and fbgemm_fp8 "
                "write them");
  if (entry.dtype == "F32") {
    if (reinterpret_cast<uintptr_t>(source) % alignof(float) == 0) {
      tensor.data = reinterpret_cast<const float*>(source);
      tensor.storage = file;
    } else {  // a header whose length is not a multiple of 4: copy rather than misalign
      auto values = std::make_shared<std::vector<float>>(num_bytes / 4);
      if (num_bytes > 0) std::memcpy(values->data(), source, num_bytes);  // data() may be null when empty
      tensor.data = values->data();
      tensor.storage = std::move(values);
    }
  } else if (is_16bit) {
    auto values = entry.dtype == "F16" ? convert_16bit(source, num_bytes / 2, fp16_to_float)
                                       : convert_16bit(source, num_bytes / 2, bf16_to_float);
    tensor.data = values->data();
    tensor.storage = std::move(values);
  } else {
    throw Error(ErrorKind::kUnsupported,
                fmt::format("{}: tensor {}: dtype {} is not supported", path, entry.name, entry.dtype),
                "store weights as F32, F16 or BF16 (or F8_E4M3 with scales: docs/quantization.md)");
  }
  return tensor;
}

void add_all(TensorMap& into, TensorMap&& from, const std::string& path) {
  for (auto& [name, tensor] : from)
    if (!into.emplace(name, std::move(tensor)).second)
      fail(ErrorKind::kFormat, "{}: tensor {} appears in more than one shard", path, name);
}

}  // namespace

TensorMap read_safetensors(const std::string& path, const SafetensorsReadOptions& options) {
  std::shared_ptr<const MappedFile> file = MappedFile::open(path);
  const uint64_t file_size = file->size();
  if (file_size < 8)
    fail(ErrorKind::kFormat, "{}: truncated safetensors file ({} bytes, the header length alone is 8)",
         path, file_size);
  const uint64_t header_size = read_u64_le(file->data());
  if (header_size > file_size - 8)
    fail(ErrorKind::kFormat, "{}: header length {} goes beyond the end of the file ({} bytes)", path,
         header_size, file_size);
  if (header_size > kMaxHeaderBytes)
    fail(ErrorKind::kFormat, "{}: header length {} is implausibly large", path, header_size);

  const std::string_view header_text(reinterpret_cast<const char*>(file->data() + 8), header_size);
  check_json_nesting(header_text, path + ": header", ErrorKind::kFormat);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(header_text);
  } catch (const nlohmann::json::exception& error) {
    fail(ErrorKind::kFormat, "{}: header is not valid JSON: {}", path, error.what());
  }
  if (!header.is_object()) fail(ErrorKind::kFormat, "{}: header is not a JSON object", path);

  const uint8_t* data_section = file->data() + 8 + header_size;
  const uint64_t data_size = file_size - 8 - header_size;
  std::vector<TensorEntry> entries;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      if (!info.is_object()) fail(ErrorKind::kFormat, "{}: __metadata__ is not an object", path);
      continue;
    }
    entries.push_back(parse_entry(path, name, info, data_size));
  }

  std::vector<const TensorEntry*> by_offset;
  for (const auto& entry : entries) by_offset.push_back(&entry);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorEntry* a, const TensorEntry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i)
    if (by_offset[i]->begin < by_offset[i - 1]->end)
      fail(ErrorKind::kFormat, "{}: tensor {}: data_offsets [{}, {}] overlap tensor {} [{}, {}]", path,
           by_offset[i]->name, by_offset[i]->begin, by_offset[i]->end, by_offset[i - 1]->name,
           by_offset[i - 1]->begin, by_offset[i - 1]->end);

  TensorMap tensors;
  for (const auto& entry : entries) tensors[entry.name] = make_tensor(path, entry, data_section, file, options);
  return tensors;
}

TensorMap read_safetensors_checkpoint(const std::string& directory, const SafetensorsReadOptions& options) {
  namespace fs = std::filesystem;
  const fs::path single = fs::path(directory) / "model.safetensors";
  const fs::path index_path = fs::path(directory) / "model.safetensors.index.json";
  if (fs::exists(single)) return read_safetensors(single.string(), options);
  if (!fs::exists(index_path))
    throw Error(ErrorKind::kNotFound,
                fmt::format("{}: neither model.safetensors nor model.safetensors.index.json exists",
                            directory),
                "pass a Hugging Face model directory or a .gguf file");

  const std::string index_name = index_path.string();
  nlohmann::json index;
  {
    std::ifstream stream(index_path, std::ios::binary);
    std::stringstream text;
    text << stream.rdbuf();
    const std::string bytes = text.str();
    check_json_nesting(bytes, index_name, ErrorKind::kFormat);
    try {
      index = nlohmann::json::parse(bytes);
    } catch (const nlohmann::json::exception& error) {
      fail(ErrorKind::kFormat, "{}: not valid JSON: {}", index_name, error.what());
    }
  }
  auto weight_map = index.is_object() ? index.find("weight_map") : index.end();
  if (!index.is_object() || weight_map == index.end() || !weight_map->is_object())
    fail(ErrorKind::kFormat, "{}: missing \"weight_map\" object", index_name);

  std::set<std::string> shard_names;
  for (const auto& [name, shard] : weight_map->items()) {
    if (!shard.is_string())
      fail(ErrorKind::kFormat, "{}: tensor {}: shard name is not a string", index_name, name);
    const std::string shard_name = shard.get<std::string>();
    if (shard_name.empty() || fs::path(shard_name).is_absolute() || shard_name.find("..") != std::string::npos)
      fail(ErrorKind::kFormat, "{}: tensor {}: shard name \"{}\" leaves the directory", index_name, name,
           shard_name);
    shard_names.insert(shard_name);
  }

  TensorMap tensors;
  for (const std::string& shard_name : shard_names) {
    const fs::path shard_path = fs::path(directory) / shard_name;
    if (!fs::exists(shard_path))
      fail(ErrorKind::kNotFound, "{}: shard {} named by {} does not exist", shard_path.string(),
           shard_name, index_name);
    add_all(tensors, read_safetensors(shard_path.string(), options), shard_path.string());
  }
  for (const auto& [name, shard] : weight_map->items())
    if (tensors.count(name) == 0)
      fail(ErrorKind::kFormat, "{}: tensor {} is listed for shard {} but not stored there", index_name,
           name, shard.get<std::string>());
  return tensors;
}

}  // namespace loom
