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
//
// FP8 tensors: a safetensors F8_E4M3 matrix read with keep_fp8 (as model
// loading reads them) is kept as it is stored, one byte per element viewed in
// the file mapping (quantized.ggml_type == kF8E4M3RowType, row_bytes ==
// shape[1] unless a column slice). Its scales are
// not in the file's tensor: model/weights.cc attaches them to a linear weight
// (QuantizedRows::fp8) from the checkpoint's `weight_scale` / `input_scale`
// (model/quantization.h). to_fp32 multiplies each row by its scale (the CPU
// backend's dequantization at load); a device upload copies the bytes and the
// scales as they are. Other F8_E4M3 tensors (not 2-D, empty, or read without
// keep_fp8) are decoded to fp32 at read, unscaled.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace loom {

// QuantizedRows::ggml_type of e4m3 rows (util/fp8.h; safetensors F8_E4M3). ggml
// has no FP8 type: this is Loom's own tag, outside ggml's type ids, so
// is_supported_ggml_type() is false for it (GGUF paths and the CPU's GGUF
// kernels refuse it by name) and ggml_type_name() spells it "F8_E4M3".
inline constexpr uint32_t kF8E4M3RowType = 0x10000;

// The scales of an FP8 linear weight (kF8E4M3RowType rows), attached by
// model/weights.cc from the checkpoint; empty (rows == nullptr) on a tensor as
// read from the file.
//   w[r][c] = e4m3(bytes[r * row_bytes + c]) * rows[r]
// A per-tensor weight scale is expanded to every row, so that matrices fused
// on a device (q/k/v, gate/up) keep each part's exact scale.
struct Fp8Scales {
  const float* rows = nullptr;  // shape[0] fp32 scales, each finite and > 0
  // Static activation scale (compressed-tensors input_scale): the input is
  // quantized as e4m3(x / input) and the product scaled by input * rows[r].
  // 0: none (dynamic activation scales, or weight-only FP8).
  float input = 0.0f;
  std::shared_ptr<const void> storage;  // keeps `rows` alive (a row slice views it at an offset)
};

// Rows in a ggml block format (formats/gguf_dequant.h), or e4m3 rows.
struct QuantizedRows {
  uint32_t ggml_type = 0;  // a GgmlType value, or kF8E4M3RowType
  const uint8_t* bytes = nullptr;
  // Row r starts at bytes + r * row_bytes. Usually the row's own size; larger in a
  // column slice of 16-bit or e4m3 rows (model/tensor_parallel.h), whose rows keep
  // the whole tensor's stride. Only the CUDA upload and to_fp32 read such slices.
  int64_t row_bytes = 0;
  Fp8Scales fp8;  // kF8E4M3RowType only
};

struct Tensor {
  std::vector<int64_t> shape;
  const float* data = nullptr;  // nullptr when quantized
  std::shared_ptr<const void> storage;
  QuantizedRows quantized;      // bytes != nullptr when the tensor is kept quantized

  bool is_quantized() const { return quantized.bytes != nullptr; }
  bool is_fp8() const { return is_quantized() && quantized.ggml_type == kF8E4M3RowType; }
  bool empty() const { return data == nullptr && quantized.bytes == nullptr; }
  int64_t numel() const {
    int64_t count = 1;
    for (int64_t dim : shape) count *= dim;
    return shape.empty() ? 0 : count;
  }
  // A tensor that owns a copy of `values`.
  static Tensor from_vector(std::vector<int64_t> shape, std::vector<float> values);
  // A 0-dimensional tensor (shape []) owning `value` as data[0]. numel() is 0
  // for shape [] (an empty Tensor{} has no shape either): read a scalar's value
  // through data.
  static Tensor scalar(float value);
};

// `tensor` itself when it holds fp32 data, else an owned fp32 copy of its values.
// e4m3 rows are multiplied by their row scales when attached (Fp8Scales::rows),
// else decoded as they are; throws Error(kFormat) for a NaN byte (0x7F / 0xFF)
// in them.
Tensor to_fp32(const Tensor& tensor);

// Name -> tensor, names as in Hugging Face checkpoints ("model.layers.0.self_attn.q_proj.weight").
using TensorMap = std::unordered_map<std::string, Tensor>;

}  // namespace loom
