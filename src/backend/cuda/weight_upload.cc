#include "backend/cuda/weight_upload.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_buffer.h"
#include "backend/cuda/kernels.h"
#include "formats/gguf_dequant.h"
#include "util/error.h"
#include "util/progress.h"

namespace loom::cuda {

namespace {

constexpr int64_t kStagingBytes = 32 << 20;  // per worker, pinned; the device scratch is as large

// How a chunk's source values reach the device.
enum class Path {
  kFloat,     // fp32 values (or GGUF blocks dequantized into fp32) -> fp32, or -> scratch -> bf16
  kBf16Copy,  // BF16 rows -> the bf16 destination as they are
  kHalf,      // F16 rows -> scratch -> bf16
  kFp8Copy,   // e4m3 rows -> the FP8 destination as they are
};

struct Chunk {
  int32_t upload = 0;
  int64_t begin = 0, count = 0;  // elements of the tensor
};

Path path_of(const WeightUpload& upload) {
  const Tensor& tensor = *upload.tensor;
  if (!tensor.is_quantized()) return Path::kFloat;
  if (tensor.is_fp8()) return Path::kFp8Copy;
  const auto type = static_cast<GgmlType>(tensor.quantized.ggml_type);
  if (upload.to_bf16 && type == GgmlType::kBF16) return Path::kBf16Copy;
  if (upload.to_bf16 && type == GgmlType::kF16) return Path::kHalf;
  return Path::kFloat;
}

// Staging bytes one element takes on its path.
int64_t staging_bytes_per_element(Path path) { return path == Path::kFloat ? 4 : path == Path::kFp8Copy ? 1 : 2; }

// Bytes one row of a kept-quantized tensor packs (FP8: one a value).
int64_t packed_row_bytes(const Tensor& tensor) {
  return tensor.is_fp8() ? tensor.shape[1]
                         : ggml_row_bytes(static_cast<GgmlType>(tensor.quantized.ggml_type), tensor.shape[1]);
}

void check_upload(const WeightUpload& upload) {
  const Tensor* tensor = upload.tensor;
  if (tensor == nullptr || tensor->empty() || upload.destination == nullptr)
    fail(ErrorKind::kFormat, "cuda backend: tensor {} is missing", upload.name);
  if (tensor->is_fp8() != upload.fp8_bytes)
    fail(ErrorKind::kUnsupported, "cuda backend: tensor {} is {}FP8 where the device model holds {}", upload.name,
         tensor->is_fp8() ? "" : "not ", upload.fp8_bytes ? "FP8" : "16-bit values");
  if (!tensor->is_quantized() || tensor->is_fp8()) return;
  if (tensor->shape.size() != 2 || !is_supported_ggml_type(tensor->quantized.ggml_type))
    fail(ErrorKind::kUnsupported, "cuda backend: tensor {} is stored as {} [{} dims], which the GPU upload cannot read",
         upload.name, ggml_type_name(tensor->quantized.ggml_type), tensor->shape.size());
}

std::vector<Chunk> plan_chunks(std::span<const WeightUpload> uploads) {
  std::vector<Chunk> chunks;
  for (size_t u = 0; u < uploads.size(); ++u) {
    const Tensor& tensor = *uploads[u].tensor;
    const int64_t numel = tensor.numel();
    const int64_t per_chunk_limit = kStagingBytes / staging_bytes_per_element(path_of(uploads[u]));
    // Block formats are read by whole rows.
    const int64_t row = tensor.is_quantized() ? tensor.shape[1] : 1;
    const int64_t per_chunk = std::max<int64_t>(row, per_chunk_limit / row * row);
    if (per_chunk > per_chunk_limit)
      fail(ErrorKind::kUnsupported, "cuda backend: tensor {} has rows of {} values, more than one upload chunk holds",
           uploads[u].name, row);
    for (int64_t begin = 0; begin < numel; begin += per_chunk)
      chunks.push_back({static_cast<int32_t>(u), begin, std::min(per_chunk, numel - begin)});
  }
  return chunks;
}

// One worker's stream and buffers; copies one chunk at a time.
class Worker {
 public:
  explicit Worker(int device) {
    LOOM_CUDA_CHECK(cudaSetDevice(device));
    LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    staging_.reserve(kStagingBytes);
    scratch_.allocate(kStagingBytes);
  }
  ~Worker() { cudaStreamDestroy(stream_); }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Returns the source bytes read.
  int64_t copy(const WeightUpload& upload, const Chunk& chunk) {
    const Tensor& tensor = *upload.tensor;
    const Path path = path_of(upload);
    int64_t source_bytes = chunk.count * 4;
    if (!tensor.is_quantized()) {
      std::memcpy(staging_.data(), tensor.data + chunk.begin, chunk.count * sizeof(float));
    } else {
      const QuantizedRows& rows = tensor.quantized;
      const auto type = static_cast<GgmlType>(rows.ggml_type);
      const int64_t row = tensor.shape[1];
      const int64_t packed = packed_row_bytes(tensor);  // less than row_bytes in a column slice
      const int64_t num_rows = chunk.count / row;
      const uint8_t* source = rows.bytes + chunk.begin / row * rows.row_bytes;
      source_bytes = num_rows * packed;
      if (rows.row_bytes == packed) {
        if (path == Path::kFloat)
          dequantize_ggml(type, source, chunk.count, staging_.as<float>());
        else
          std::memcpy(staging_.data(), source, source_bytes);
      } else {
        for (int64_t r = 0; r < num_rows; ++r) {
          if (path == Path::kFloat)
            dequantize_ggml(type, source + r * rows.row_bytes, row, staging_.as<float>() + r * row);
          else
            std::memcpy(staging_.as<uint8_t>() + r * packed, source + r * rows.row_bytes, packed);
        }
      }
    }
    const int64_t staged_bytes = chunk.count * staging_bytes_per_element(path);
    auto* bf16_destination = static_cast<__nv_bfloat16*>(upload.destination) + chunk.begin;
    if (path == Path::kFp8Copy) {
      LOOM_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(upload.destination) + chunk.begin, staging_.data(),
                                      staged_bytes, cudaMemcpyHostToDevice, stream_));
    } else if (path == Path::kBf16Copy) {
      LOOM_CUDA_CHECK(cudaMemcpyAsync(bf16_destination, staging_.data(), staged_bytes, cudaMemcpyHostToDevice, stream_));
    } else if (path == Path::kHalf || upload.to_bf16) {
      LOOM_CUDA_CHECK(cudaMemcpyAsync(scratch_.data(), staging_.data(), staged_bytes, cudaMemcpyHostToDevice, stream_));
      if (path == Path::kHalf)
        launch_f16_to_bf16(scratch_.as<uint16_t>(), chunk.count, bf16_destination, stream_);
      else
        launch_f32_to_bf16(scratch_.as<float>(), chunk.count, bf16_destination, stream_);
    } else {
      LOOM_CUDA_CHECK(cudaMemcpyAsync(static_cast<float*>(upload.destination) + chunk.begin, staging_.data(),
                                      staged_bytes, cudaMemcpyHostToDevice, stream_));
    }
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the staging buffer is reused by the next chunk
    return source_bytes;
  }

 private:
  cudaStream_t stream_ = nullptr;
  PinnedBuffer staging_;
  DeviceBuffer scratch_;
};

}  // namespace

WeightUploadStats upload_weights(std::span<const WeightUpload> uploads, int device) {
  for (const WeightUpload& upload : uploads) check_upload(upload);
  const std::vector<Chunk> chunks = plan_chunks(uploads);
  WeightUploadStats stats;
  if (chunks.empty()) return stats;
  for (const WeightUpload& upload : uploads)
    stats.source_bytes +=
        upload.tensor->is_quantized() ? packed_row_bytes(*upload.tensor) * upload.tensor->shape[0]
                                      : upload.tensor->numel() * 4;
  const unsigned cores = std::max(2u, std::thread::hardware_concurrency());
  stats.num_workers = static_cast<int32_t>(std::clamp<size_t>(cores / 2, 1, std::min<size_t>(8, chunks.size())));

  Progress progress("loading the weights onto the GPU", stats.source_bytes);
  std::mutex mutex;  // progress and first_error
  std::exception_ptr first_error;
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  auto work = [&] {
    try {
      Worker worker(device);
      for (size_t i = next++; i < chunks.size() && !failed; i = next++) {
        const int64_t bytes = worker.copy(uploads[chunks[i].upload], chunks[i]);
        std::lock_guard lock(mutex);
        progress.advance(bytes);
      }
    } catch (...) {
      failed = true;
      std::lock_guard lock(mutex);
      if (first_error == nullptr) first_error = std::current_exception();
    }
  };
  {
    std::vector<std::jthread> workers;
    for (int32_t w = 1; w < stats.num_workers; ++w) workers.emplace_back(work);
    work();
  }
  if (first_error != nullptr) std::rethrow_exception(first_error);
  return stats;
}

}  // namespace loom::cuda
