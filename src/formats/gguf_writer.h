// Minimal GGUF (v2/v3) writer: metadata of any type and raw tensor bytes.
// Used by tests and tools to build GGUF files; Loom itself only reads GGUF.
// Not thread-safe; one writer per file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom {

class GgufWriter {
 public:
  // GGUF metadata value type ids (gguf_type).
  enum ValueType : uint32_t {
    kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kU32 = 4, kI32 = 5, kF32 = 6, kBool = 7,
    kString = 8, kArray = 9, kU64 = 10, kI64 = 11, kF64 = 12,
  };

  void add_u32(const std::string& key, uint32_t value);
  void add_i32(const std::string& key, int32_t value);
  void add_u64(const std::string& key, uint64_t value);
  void add_i64(const std::string& key, int64_t value);
  void add_f32(const std::string& key, float value);
  void add_f64(const std::string& key, double value);
  void add_bool(const std::string& key, bool value);
  void add_string(const std::string& key, const std::string& value);
  void add_string_array(const std::string& key, const std::vector<std::string>& values);
  void add_i32_array(const std::string& key, const std::vector<int32_t>& values);
  void add_f32_array(const std::string& key, const std::vector<float>& values);
  // Any value, already encoded (everything after the type id).
  void add_raw(const std::string& key, uint32_t value_type, const std::string& encoded_value);

  // `ggml_dims` in GGUF order (dims[0] is the fastest-varying, i.e. torch's last
  // dimension); `bytes` is the tensor data exactly as stored for `ggml_type`.
  void add_tensor(const std::string& name, std::vector<uint64_t> ggml_dims, uint32_t ggml_type,
                  std::string bytes);

  // Data alignment; also written as general.alignment when not the default 32.
  void set_alignment(uint32_t alignment);

  // Throws Error(kInvalidArgument) when the file cannot be written.
  void write(const std::string& path, uint32_t version = 3) const;

  // Little-endian encodings, for add_raw and for building tensor bytes.
  static std::string encode_string(const std::string& value);
  template <typename T>
  static std::string encode(T value) {
    return std::string(reinterpret_cast<const char*>(&value), sizeof(T));
  }

 private:
  struct PendingTensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    std::string bytes;
  };
  std::string metadata_;
  uint64_t num_metadata_ = 0;
  std::vector<PendingTensor> tensors_;
  uint32_t alignment_ = 32;
};

}  // namespace loom
