// Streams host tensors to the GPU in the format they are stored in: fp32
// (Tensor::data), or rows kept in their file format (Tensor::quantized: BF16 and
// F16 checkpoints viewed in their file mapping, GGUF block types). Nothing is
// expanded on the host beyond one staging chunk: BF16 is copied as is, F16 and
// fp32 are converted to bf16 on the device, GGUF block types are dequantized
// chunk by chunk into the staging buffer, FP8 (e4m3) rows are copied as they are
// into FP8 destinations (their scales are the caller's).
//
// Several chunks are in flight: a few worker threads, each with its own stream,
// pinned staging buffer and device scratch, take row-aligned chunks of any
// tensor in turn, so reading the file (page faults on the mapping) overlaps the
// copies and conversions of the others. Returns when every byte has landed.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "formats/tensor.h"

namespace loom::cuda {

struct WeightUpload {
  std::string name;             // for errors
  const Tensor* tensor = nullptr;  // fp32 or Tensor::quantized; outlives the call
  void* destination = nullptr;  // device memory for numel() values
  bool to_bf16 = true;          // destination holds bf16 (else fp32)
  bool fp8_bytes = false;       // destination holds e4m3: the tensor's FP8 rows copied as they are
};

struct WeightUploadStats {
  int64_t source_bytes = 0;  // read from the host tensors
  int32_t num_workers = 0;
};

// Uploads every item on `device`; throws Error naming the tensor on a missing
// tensor or an unsupported format, and rethrows the first worker's error
// after all have stopped.
WeightUploadStats upload_weights(std::span<const WeightUpload> uploads, int device);

}  // namespace loom::cuda
