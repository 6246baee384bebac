// GGUF container parsing: header, metadata, tensor infos, tensor data.
// Spec: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
#include "formats/gguf.h"

#include <cstring>
#include <optional>

#include <fmt/ranges.h>

#include "formats/gguf_dequant.h"
#include "formats/gguf_names.h"
#include "util/error.h"
#include "util/mapped_file.h"

namespace loom {

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint32_t kMaxDims = 8;

enum class ValueType : uint32_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
  kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
};

// Bounds-checked little-endian reader over the mapping.
class Cursor {
 public:
  Cursor(const MappedFile& file) : data_(file.data()), size_(file.size()), path_(file.path()) {}

  size_t position() const { return position_; }
  size_t remaining() const { return size_ - position_; }

  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T value;
    std::memcpy(&value, data_ + position_, sizeof(T));
    position_ += sizeof(T);
    return value;
  }

  std::string read_string(const char* what) {
    const uint64_t length = read<uint64_t>(what);
    need(length, what);
    std::string text(reinterpret_cast<const char*>(data_ + position_), length);
    position_ += length;
    return text;
  }

  void need(uint64_t num_bytes, const std::string& what) const {
    if (num_bytes > remaining())
      fail(ErrorKind::kFormat, "{}: truncated GGUF file: {} needs {} bytes at offset {}, {} left", path_,
           what, num_bytes, position_, remaining());
  }

 private:
  const uint8_t* data_;
  size_t size_;
  const std::string& path_;
  size_t position_ = 0;
};

int64_t scalar_as_int(Cursor& cursor, ValueType type, const char* what) {
  switch (type) {
    case ValueType::kU8: return cursor.read<uint8_t>(what);
    case ValueType::kI8: return cursor.read<int8_t>(what);
    case ValueType::kU16: return cursor.read<uint16_t>(what);
    case ValueType::kI16: return cursor.read<int16_t>(what);
    case ValueType::kU32: return cursor.read<uint32_t>(what);
    case ValueType::kI32: return cursor.read<int32_t>(what);
    case ValueType::kI64: return cursor.read<int64_t>(what);
    case ValueType::kU64: return static_cast<int64_t>(cursor.read<uint64_t>(what));
    case ValueType::kBool: return cursor.read<uint8_t>(what) != 0;
    default: break;
  }
  fail(ErrorKind::kInternal, "not an integer GGUF type");
}

bool is_integer_type(ValueType type) {
  switch (type) {
    case ValueType::kU8: case ValueType::kI8: case ValueType::kU16: case ValueType::kI16:
    case ValueType::kU32: case ValueType::kI32: case ValueType::kU64: case ValueType::kI64:
      return true;
    default:
      return false;
  }
}

// Smallest encoding of one element, to reject absurd array counts before allocating.
uint64_t min_element_bytes(ValueType type) {
  switch (type) {
    case ValueType::kU8: case ValueType::kI8: case ValueType::kBool: return 1;
    case ValueType::kU16: case ValueType::kI16: return 2;
    case ValueType::kU32: case ValueType::kI32: case ValueType::kF32: return 4;
    case ValueType::kArray: return 12;
    default: return 8;  // u64, i64, f64, string length
  }
}

bool is_known_type(uint32_t type) { return type <= static_cast<uint32_t>(ValueType::kF64); }

// Returns nullopt for nested arrays, which the llama family never uses: they
// are parsed (to stay in sync) and dropped.
std::optional<GgufValue> read_value(Cursor& cursor, ValueType type, const std::string& path,
                                    const std::string& key, int depth = 0) {
  if (is_integer_type(type)) {
    if (type == ValueType::kU64) return GgufValue(cursor.read<uint64_t>("metadata value"));
    if (type == ValueType::kU8 || type == ValueType::kU16 || type == ValueType::kU32)
      return GgufValue(static_cast<uint64_t>(scalar_as_int(cursor, type, "metadata value")));
    return GgufValue(scalar_as_int(cursor, type, "metadata value"));
  }
  switch (type) {
    case ValueType::kF32: return GgufValue(static_cast<double>(cursor.read<float>("metadata value")));
    case ValueType::kF64: return GgufValue(cursor.read<double>("metadata value"));
    case ValueType::kBool: return GgufValue(cursor.read<uint8_t>("metadata value") != 0);
    case ValueType::kString: return GgufValue(cursor.read_string("metadata string"));
    case ValueType::kArray: break;
    default: fail(ErrorKind::kInternal, "unhandled GGUF value type");
  }
  const uint32_t element_type_id = cursor.read<uint32_t>("array element type");
  const uint64_t count = cursor.read<uint64_t>("array length");
  if (!is_known_type(element_type_id))
    fail(ErrorKind::kFormat, "{}: metadata {}: unknown array element type {}", path, key, element_type_id);
  const auto element_type = static_cast<ValueType>(element_type_id);
  if (count > cursor.remaining() / min_element_bytes(element_type))
    fail(ErrorKind::kFormat, "{}: metadata {}: array of {} elements is longer than the file", path, key,
         count);
  if (depth > 2) fail(ErrorKind::kFormat, "{}: metadata {}: arrays nested too deeply", path, key);
  if (element_type == ValueType::kString) {
    std::vector<std::string> strings;
    strings.reserve(count);
    for (uint64_t i = 0; i < count; ++i) strings.push_back(cursor.read_string("metadata string"));
    return GgufValue(std::move(strings));
  }
  if (element_type == ValueType::kF32 || element_type == ValueType::kF64) {
    std::vector<double> numbers(count);
    for (uint64_t i = 0; i < count; ++i)
      numbers[i] = element_type == ValueType::kF32 ? cursor.read<float>("array element")
                                                   : cursor.read<double>("array element");
    return GgufValue(std::move(numbers));
  }
  if (element_type == ValueType::kArray) {
    for (uint64_t i = 0; i < count; ++i) read_value(cursor, element_type, path, key, depth + 1);
    return std::nullopt;
  }
  std::vector<int64_t> numbers(count);  // integers and bools
  for (uint64_t i = 0; i < count; ++i) numbers[i] = scalar_as_int(cursor, element_type, "array element");
  return GgufValue(std::move(numbers));
}

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> dims;  // ggml order: dims[0] is the fastest-varying
  uint32_t type = 0;
  uint64_t offset = 0;
};

uint64_t metadata_u64(const GgufFile& gguf, const std::string& key, uint64_t fallback) {
  if (!gguf.has(key)) return fallback;
  const int64_t value = gguf.get_int(key);
  if (value <= 0) fail(ErrorKind::kFormat, "{}: {} must be positive, got {}", gguf.path, key, value);
  return static_cast<uint64_t>(value);
}

bool is_rope_permuted(const std::string& hf_name) {
  auto ends_with = [&](const char* suffix) {
    const size_t length = std::strlen(suffix);
    return hf_name.size() >= length && hf_name.compare(hf_name.size() - length, length, suffix) == 0;
  };
  return ends_with(".self_attn.q_proj.weight") || ends_with(".self_attn.q_proj.bias") ||
         ends_with(".self_attn.k_proj.weight") || ends_with(".self_attn.k_proj.bias");
}

bool is_q_projection(const std::string& hf_name) {
  return hf_name.find(".self_attn.q_proj.") != std::string::npos;
}

Tensor load_tensor(const GgufFile& gguf, const TensorInfo& info, const uint8_t* data_section,
                   uint64_t data_size, const std::string& hf_name, int64_t num_permuted_heads,
                   bool keep_quantized) {
  const std::string& path = gguf.path;
  if (!is_supported_ggml_type(info.type))
    throw Error(ErrorKind::kUnsupported,
                fmt::format("{}: tensor {}: type {} is not supported", path, info.name,
                            ggml_type_name(info.type)),
                fmt::format("Loom reads {} GGUF tensors", supported_ggml_type_names()));
  const auto type = static_cast<GgmlType>(info.type);
  const GgmlBlockLayout layout = ggml_block_layout(type);
  if (info.dims.empty() || info.dims[0] % layout.elements_per_block != 0)
    fail(ErrorKind::kFormat, "{}: tensor {}: row length {} is not a multiple of the {} block size {}",
         path, info.name, info.dims.empty() ? 0 : info.dims[0], ggml_type_name(info.type),
         layout.elements_per_block);
  // The product of the non-zero dimensions is bounded too: [0, 2^63] holds no
  // data, but its shape would overflow Tensor::numel().
  uint64_t num_elements = 1, nonzero_product = 1;
  for (uint64_t dim : info.dims) {
    if (dim != 0 && nonzero_product > (uint64_t{1} << 48) / dim)
      fail(ErrorKind::kFormat, "{}: tensor {}: dimensions [{}] are implausibly large", path, info.name,
           fmt::join(info.dims, ", "));
    num_elements *= dim;
    if (dim != 0) nonzero_product *= dim;
  }
  if (num_elements == 0)
    fail(ErrorKind::kFormat, "{}: tensor {}: dimensions [{}] hold no elements", path, info.name,
         fmt::join(info.dims, ", "));
  const uint64_t num_bytes = num_elements / layout.elements_per_block * layout.bytes_per_block;
  if (info.offset > data_size || num_bytes > data_size - info.offset)
    fail(ErrorKind::kFormat,
         "{}: tensor {}: data [{}, {}) lies beyond the end of the data section ({} bytes; truncated file?)",
         path, info.name, info.offset, info.offset + num_bytes, data_size);

  Tensor tensor;
  for (auto dim = info.dims.rbegin(); dim != info.dims.rend(); ++dim)
    tensor.shape.push_back(static_cast<int64_t>(*dim));
  const uint8_t* source = data_section + info.offset;
  const bool permute = num_permuted_heads > 0 && is_rope_permuted(hf_name);
  if (type == GgmlType::kF32 && !permute && reinterpret_cast<uintptr_t>(source) % alignof(float) == 0) {
    tensor.data = reinterpret_cast<const float*>(source);
    tensor.storage = gguf.file;
    return tensor;
  }
  const int64_t num_rows = tensor.shape[0];
  // Two tests, not num_rows % (2 * heads): a hostile head count must not overflow.
  if (permute && (num_rows % num_permuted_heads != 0 || (num_rows / num_permuted_heads) % 2 != 0))
    fail(ErrorKind::kFormat, "{}: tensor {}: {} rows do not split into {} heads of even size", path, info.name,
         num_rows, num_permuted_heads);
  if (keep_quantized && type != GgmlType::kF32 && info.dims.size() == 2) {
    tensor.quantized.ggml_type = info.type;
    tensor.quantized.row_bytes = static_cast<int64_t>(num_bytes) / num_rows;
    if (!permute) {
      tensor.quantized.bytes = source;
      tensor.storage = gguf.file;
      return tensor;
    }
    auto bytes = std::make_shared<std::vector<uint8_t>>(source, source + num_bytes);
    unpermute_rope_row_bytes(bytes->data(), num_permuted_heads, num_rows / num_permuted_heads,
                             tensor.quantized.row_bytes);
    tensor.quantized.bytes = bytes->data();
    tensor.storage = std::move(bytes);
    return tensor;
  }
  auto values = std::make_shared<std::vector<float>>(num_elements);
  dequantize_ggml(type, source, static_cast<int64_t>(num_elements), values->data());
  if (permute) {
    const int64_t row_length = static_cast<int64_t>(num_elements) / std::max<int64_t>(num_rows, 1);
    unpermute_rope_rows(values->data(), num_permuted_heads, num_rows / num_permuted_heads, row_length);
  }
  tensor.data = values->data();
  tensor.storage = std::move(values);
  return tensor;
}

}  // namespace

int64_t GgufFile::get_int(const std::string& key) const {
  auto found = metadata.find(key);
  if (found == metadata.end()) fail(ErrorKind::kFormat, "{}: missing metadata key {}", path, key);
  if (const auto* value = std::get_if<int64_t>(&found->second)) return *value;
  if (const auto* value = std::get_if<uint64_t>(&found->second)) {
    if (*value > static_cast<uint64_t>(INT64_MAX))
      fail(ErrorKind::kFormat, "{}: metadata {} = {} is out of range", path, key, *value);
    return static_cast<int64_t>(*value);
  }
  fail(ErrorKind::kFormat, "{}: metadata {} is not an integer", path, key);
}

double GgufFile::get_float(const std::string& key) const {
  auto found = metadata.find(key);
  if (found == metadata.end()) fail(ErrorKind::kFormat, "{}: missing metadata key {}", path, key);
  if (const auto* value = std::get_if<double>(&found->second)) return *value;
  if (std::holds_alternative<int64_t>(found->second) || std::holds_alternative<uint64_t>(found->second))
    return static_cast<double>(get_int(key));
  fail(ErrorKind::kFormat, "{}: metadata {} is not a number", path, key);
}

std::string GgufFile::get_string(const std::string& key) const {
  auto found = metadata.find(key);
  if (found == metadata.end()) fail(ErrorKind::kFormat, "{}: missing metadata key {}", path, key);
  if (const auto* value = std::get_if<std::string>(&found->second)) return *value;
  fail(ErrorKind::kFormat, "{}: metadata {} is not a string", path, key);
}

const std::vector<std::string>& GgufFile::get_string_array(const std::string& key) const {
  auto found = metadata.find(key);
  if (found == metadata.end()) fail(ErrorKind::kFormat, "{}: missing metadata key {}", path, key);
  if (const auto* value = std::get_if<std::vector<std::string>>(&found->second)) return *value;
  fail(ErrorKind::kFormat, "{}: metadata {} is not an array of strings", path, key);
}

GgufFile read_gguf(const std::string& path, const GgufReadOptions& options) {
  GgufFile gguf;
  gguf.path = path;
  gguf.file = MappedFile::open(path);
  Cursor cursor(*gguf.file);

  if (gguf.file->size() < 4 || cursor.read<uint32_t>("magic") != kGgufMagic)
    fail(ErrorKind::kFormat, "{}: not a GGUF file (bad magic)", path);
  gguf.version = cursor.read<uint32_t>("version");
  if (gguf.version != 2 && gguf.version != 3)
    fail(ErrorKind::kUnsupported, "{}: GGUF version {} is not supported (only 2 and 3)", path,
         gguf.version);
  const uint64_t num_tensors = cursor.read<uint64_t>("tensor count");
  const uint64_t num_metadata = cursor.read<uint64_t>("metadata count");
  // Each entry takes at least 12 (metadata) or 24 (tensor info) bytes.
  if (num_metadata > cursor.remaining() / 12 || num_tensors > cursor.remaining() / 24)
    fail(ErrorKind::kFormat, "{}: truncated GGUF file: {} metadata entries and {} tensors cannot fit in it", path,
         num_metadata, num_tensors);

  for (uint64_t i = 0; i < num_metadata; ++i) {
    std::string key = cursor.read_string("metadata key");
    const uint32_t type = cursor.read<uint32_t>("metadata type");
    if (!is_known_type(type))
      fail(ErrorKind::kFormat, "{}: metadata {}: unknown value type {}", path, key, type);
    std::optional<GgufValue> value = read_value(cursor, static_cast<ValueType>(type), path, key);
    if (value) gguf.metadata[key] = std::move(*value);
  }

  std::vector<TensorInfo> infos(num_tensors);
  for (TensorInfo& info : infos) {
    info.name = cursor.read_string("tensor name");
    const uint32_t num_dims = cursor.read<uint32_t>("tensor dimension count");
    if (num_dims == 0 || num_dims > kMaxDims)
      fail(ErrorKind::kFormat, "{}: tensor {}: {} dimensions", path, info.name, num_dims);
    for (uint32_t d = 0; d < num_dims; ++d) info.dims.push_back(cursor.read<uint64_t>("tensor dimension"));
    info.type = cursor.read<uint32_t>("tensor type");
    info.offset = cursor.read<uint64_t>("tensor offset");
  }

  const uint64_t alignment = metadata_u64(gguf, "general.alignment", kDefaultAlignment);
  if ((alignment & (alignment - 1)) != 0)
    fail(ErrorKind::kFormat, "{}: general.alignment {} is not a power of two", path, alignment);
  const uint64_t data_start = (cursor.position() + alignment - 1) / alignment * alignment;
  const uint64_t file_size = gguf.file->size();
  if (num_tensors > 0 && data_start > file_size)
    fail(ErrorKind::kFormat, "{}: truncated GGUF file: tensor data would start at {} but the file has {} bytes",
         path, data_start, file_size);

  const std::string architecture =
      gguf.has("general.architecture") ? gguf.get_string("general.architecture") : "";
  if (architecture != "llama" && architecture != "qwen2" && architecture != "qwen3")
    throw Error(ErrorKind::kUnsupported,
                fmt::format("{}: GGUF architecture \"{}\" is not supported", path, architecture),
                "supported GGUF architectures: llama, qwen2, qwen3");
  // Only llama's converter permutes Q/K rows; qwen2/qwen3 use NeoX-style RoPE in llama.cpp.
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  if (architecture == "llama") {
    num_heads = gguf.get_int("llama.attention.head_count");
    num_kv_heads = gguf.has("llama.attention.head_count_kv")
                       ? gguf.get_int("llama.attention.head_count_kv") : num_heads;
    if (num_heads <= 0 || num_kv_heads <= 0)
      fail(ErrorKind::kFormat, "{}: head counts must be positive ({} / {})", path, num_heads, num_kv_heads);
  }

  const uint8_t* data_section = gguf.file->data() + std::min(data_start, file_size);
  const uint64_t data_size = file_size - std::min(data_start, file_size);
  for (const TensorInfo& info : infos) {
    const std::string hf_name = gguf_to_hf_tensor_name(info.name).value_or(info.name);
    const int64_t num_permuted_heads = is_q_projection(hf_name) ? num_heads : num_kv_heads;
    Tensor tensor =
        load_tensor(gguf, info, data_section, data_size, hf_name, num_permuted_heads, options.keep_quantized);
    if (!gguf.tensors.emplace(hf_name, std::move(tensor)).second)
      fail(ErrorKind::kFormat, "{}: tensor {} appears twice", path, info.name);
  }
  return gguf;
}

}  // namespace loom
