// safetensors reading (memory-mapped) and writing.
//
// Format: u64 little-endian header length N, N bytes of JSON
// {"name": {"dtype": "F32"|"F16"|"BF16"|..., "shape": [...], "data_offsets": [begin, end]}, ...,
//  "__metadata__": {...}}, then the data section (offsets relative to it).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "formats/tensor.h"

namespace loom {

struct SafetensorsReadOptions {
  // 2-D F16/BF16 tensors stay in the file's 16-bit format, viewed in place as
  // Tensor::quantized rows (GgmlType kF16 / kBF16), for the CPU backend's
  // kernels (--cpu-precision auto); others are read as below.
  bool keep_16bit = false;
  // 2-D F8_E4M3 tensors stay e4m3 rows viewed in place (Tensor::quantized,
  // kF8E4M3RowType; formats/tensor.h), their scales being other tensors that
  // model/ pairs with them: what loading an FP8 checkpoint needs. Otherwise
  // (and for other shapes) e4m3 values are decoded to fp32 as they are, unscaled.
  bool keep_fp8 = false;
};

// Reads every tensor of one file as fp32 (but see the options). F32 tensors
// point into the mapping (no copy); F16/BF16 and F8_E4M3 are converted into
// owned buffers. Throws Error(kFormat) naming the file
// (and tensor) for a truncated file, bad header, offsets out of range or
// overlapping, size that does not match dtype x shape; Error(kUnsupported) for
// a dtype other than F32/F16/BF16/F8_E4M3 (F8_E5M2 among them).
TensorMap read_safetensors(const std::string& path, const SafetensorsReadOptions& options = {});

// Reads a checkpoint directory: model.safetensors, or the shards listed in
// model.safetensors.index.json ("weight_map": name -> file). Throws Error(kNotFound)
// when neither exists or a shard named by the index is missing.
TensorMap read_safetensors_checkpoint(const std::string& directory, const SafetensorsReadOptions& options = {});

// kF8E4M3: e4m3 bytes (util/fp8.h), as FP8 checkpoints store linear weights.
enum class StoredDtype { kF32, kF16, kBF16, kF8E4M3 };

// Writes tensors with optional string metadata. Each tensor is stored in
// `dtypes[name]` when named there, else as kF8E4M3 when it is kept as e4m3
// rows (Tensor::is_fp8(): its bytes as they are, scales not included), else in
// `dtype`. Values are converted to their dtype (round to nearest even; e4m3
// saturates at +-448). Tensors are laid out by element size, largest first,
// then by name (safetensors' own order), so each starts aligned to its element
// size. A 0-dimensional tensor (Tensor::scalar) is stored as one value.
void write_safetensors(const std::string& path, const TensorMap& tensors,
                       StoredDtype dtype = StoredDtype::kF32,
                       const std::map<std::string, std::string>& metadata = {},
                       const std::map<std::string, StoredDtype>& dtypes = {});

}  // namespace loom
