// GGUF (v2/v3) reader for the llama architecture family.
//
// Container and tensors only (ModelConfig from its metadata: model/gguf_config.h).
// Tensors F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K are
// dequantized to fp32 at load (or, with keep_quantized, 2-D ones stay in their
// block format: Tensor::quantized) and renamed to Hugging Face names (blk.N.attn_q.weight -> model.layers.N.self_attn.q_proj.weight),
// with Q and K rows un-permuted from GGUF's interleaved RoPE layout back to HF's
// rotate-half layout, so the rest of Loom sees exactly what a HF checkpoint holds.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "formats/tensor.h"

namespace loom {

class MappedFile;

// One metadata value. Arrays hold homogeneous scalars or strings.
using GgufValue = std::variant<int64_t, uint64_t, double, bool, std::string,
                               std::vector<int64_t>, std::vector<double>, std::vector<std::string>>;

struct GgufFile {
  std::string path;
  uint32_t version = 0;
  std::map<std::string, GgufValue> metadata;
  TensorMap tensors;  // HF names, fp32, HF layout
  std::shared_ptr<const MappedFile> file;

  // Typed metadata access; throw Error(kFormat) naming the path and key when missing or ill-typed.
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  const std::vector<std::string>& get_string_array(const std::string& key) const;
  bool has(const std::string& key) const { return metadata.count(key) != 0; }
};

struct GgufReadOptions {
  // 2-D tensors of a type other than F32 keep their file format (Tensor::quantized),
  // views of the mapping (or of an owned copy for Q/K rows, which are re-ordered).
  bool keep_quantized = false;
};

// Throws Error(kFormat) naming the file (and tensor) for bad magic, truncation,
// offsets beyond the file; Error(kUnsupported) for another architecture or a
// tensor type outside the list above.
GgufFile read_gguf(const std::string& path, const GgufReadOptions& options = {});

}  // namespace loom
