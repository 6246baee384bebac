// Tensor: a named fp32 host array with shared storage, the unit every file
// format in formats/ reads and writes (and model/ builds ModelWeights from).
//
// Ownership: a Tensor views `data`, which stays valid while `storage` lives;
// storage is either a memory-mapped file (f32 safetensors, used in place) or an
// owned buffer (converted f16/bf16, dequantized GGUF). Immutable after loading.
//
// Quantized tensors: a GGUF read with keep_quantized (formats/gguf.h) leaves 2-D
// tensors of a block type (Q4_1, Q8_0, F16, ...) in their file format. Then
// `data` is nullptr and `quantized` views the rows: shape[0] rows of shape[1]
// elements, each row_bytes long, back to back; `storage` keeps them alive. Only
// the CPU backend reads such tensors; everything else wants fp32 (to_fp32).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace loom {

// Rows in a ggml block format (formats/gguf_dequant.h).
struct QuantizedRows {
  uint32_t ggml_type = 0;  // a GgmlType value
  const uint8_t* bytes = nullptr;
  // Row r starts at bytes + r * row_bytes. Usually the row's own size; larger in a
  // column slice of 16-bit rows (model/tensor_parallel.h), whose rows keep the
  // whole tensor's stride. Only the CUDA upload and to_fp32 read such slices.
  int64_t row_bytes = 0;
};

struct Tensor {
  std::vector<int64_t> shape;
  const float* data = nullptr;  // nullptr when quantized
  std::shared_ptr<const void> storage;
  QuantizedRows quantized;      // bytes != nullptr when the tensor is kept quantized

  bool is_quantized() const { return quantized.bytes != nullptr; }
  bool empty() const { return data == nullptr && quantized.bytes == nullptr; }
  int64_t numel() const {
    int64_t count = 1;
    for (int64_t dim : shape) count *= dim;
    return shape.empty() ? 0 : count;
  }
  // A tensor that owns a copy of `values`.
  static Tensor from_vector(std::vector<int64_t> shape, std::vector<float> values);
};

// `tensor` itself when it holds fp32 data, else an owned fp32 copy of its values.
Tensor to_fp32(const Tensor& tensor);

// Name -> tensor, names as in Hugging Face checkpoints ("model.layers.0.self_attn.q_proj.weight").
using TensorMap = std::unordered_map<std::string, Tensor>;

}  // namespace loom
