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
};

// Reads every tensor of one file as fp32. F32 tensors point into the mapping
// (no copy); F16/BF16 are converted into owned buffers. Throws Error(kFormat)
// naming the file (and tensor) for a truncated file, bad header, offsets out
// of range or overlapping, size that does not match dtype x shape; Error(kUnsupported)
// for a dtype other than F32/F16/BF16.
TensorMap read_safetensors(const std::string& path, const SafetensorsReadOptions& options = {});

// Reads a checkpoint directory: model.safetensors, or the shards listed in
// model.safetensors.index.json ("weight_map": name -> file). Throws Error(kNotFound)
// when neither exists or a shard named by the index is missing.
TensorMap read_safetensors_checkpoint(const std::string& directory, const SafetensorsReadOptions& options = {});

enum class StoredDtype { kF32, kF16, kBF16 };

// Writes tensors (sorted by name, 8-byte aligned data) with optional string
// metadata. Values are converted to `dtype` (round to nearest even).
void write_safetensors(const std::string& path, const TensorMap& tensors,
                       StoredDtype dtype = StoredDtype::kF32,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace loom
