#include "formats/gguf_writer.h"

#include <fstream>

#include "util/error.h"

namespace loom {

std::string GgufWriter::encode_string(const std::string& value) {
  return encode<uint64_t>(value.size()) + value;
}

void GgufWriter::add_raw(const std::string& key, uint32_t value_type, const std::string& encoded_value) {
  metadata_ += encode_string(key) + encode<uint32_t>(value_type) + encoded_value;
  ++num_metadata_;
}

void GgufWriter::add_u32(const std::string& key, uint32_t value) { add_raw(key, kU32, encode(value)); }
void GgufWriter::add_i32(const std::string& key, int32_t value) { add_raw(key, kI32, encode(value)); }
void GgufWriter::add_u64(const std::string& key, uint64_t value) { add_raw(key, kU64, encode(value)); }
void GgufWriter::add_i64(const std::string& key, int64_t value) { add_raw(key, kI64, encode(value)); }
void GgufWriter::add_f32(const std::string& key, float value) { add_raw(key, kF32, encode(value)); }
void GgufWriter::add_f64(const std::string& key, double value) { add_raw(key, kF64, encode(value)); }
void GgufWriter::add_bool(const std::string& key, bool value) {
  add_raw(key, kBool, encode<uint8_t>(value ? 1 : 0));
}
void GgufWriter::add_string(const std::string& key, const std::string& value) {
  add_raw(key, kString, encode_string(value));
}

void GgufWriter::add_string_array(const std::string& key, const std::vector<std::string>& values) {
  std::string encoded = encode<uint32_t>(kString) + encode<uint64_t>(values.size());
  for (const auto& value : values) encoded += encode_string(value);
  add_raw(key, kArray, encoded);
}

void GgufWriter::add_i32_array(const std::string& key, const std::vector<int32_t>& values) {
  std::string encoded = encode<uint32_t>(kI32) + encode<uint64_t>(values.size());
  for (int32_t value : values) encoded += encode(value);
  add_raw(key, kArray, encoded);
}

void GgufWriter::add_f32_array(const std::string& key, const std::vector<float>& values) {
  std::string encoded = encode<uint32_t>(kF32) + encode<uint64_t>(values.size());
  for (float value : values) encoded += encode(value);
  add_raw(key, kArray, encoded);
}

void GgufWriter::add_tensor(const std::string& name, std::vector<uint64_t> ggml_dims, uint32_t ggml_type,
                            std::string bytes) {
  tensors_.push_back({name, std::move(ggml_dims), ggml_type, std::move(bytes)});
}

void GgufWriter::set_alignment(uint32_t alignment) {
  LOOM_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0);
  alignment_ = alignment;
  if (alignment != 32) add_u32("general.alignment", alignment);
}

void GgufWriter::write(const std::string& path, uint32_t version) const {
  auto pad_to_alignment = [&](std::string& text) {
    text.append((alignment_ - text.size() % alignment_) % alignment_, '\0');
  };
  std::string header = encode<uint32_t>(0x46554747) + encode<uint32_t>(version) +
                       encode<uint64_t>(tensors_.size()) + encode<uint64_t>(num_metadata_) + metadata_;
  std::string data;
  for (const PendingTensor& tensor : tensors_) {
    pad_to_alignment(data);
    header += encode_string(tensor.name) + encode<uint32_t>(tensor.dims.size());
    for (uint64_t dim : tensor.dims) header += encode(dim);
    header += encode<uint32_t>(tensor.type) + encode<uint64_t>(data.size());
    data += tensor.bytes;
  }
  pad_to_alignment(header);
  std::ofstream stream(path, std::ios::binary | std::ios::trunc);
  if (!stream) fail(ErrorKind::kInvalidArgument, "cannot create {}", path);
  stream << header << data;
  stream.flush();
  if (!stream) fail(ErrorKind::kInvalidArgument, "{}: write failed", path);
}

}  // namespace loom
