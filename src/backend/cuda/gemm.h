// Dense bf16 GEMMs through cuBLAS: Y[m, n] (+)= X[m, k] W[n, k]^T, torch.nn.Linear
// on row-major tensors, fp32 accumulation, fp32 or bf16 output.
// Owns its cuBLAS handle and a fixed workspace (so that a captured CUDA graph
// never asks cuBLAS to allocate). Thread: the owning backend's thread.
#pragma once

#include <cstdint>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "backend/cuda/device_buffer.h"

namespace loom::cuda {

class Gemm {
 public:
  explicit Gemm(cudaStream_t stream);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  enum class Output { kF32, kBF16 };

  // y[row * y_stride + col] = beta * y + x[row, :] . w[col, :] for row < m, col < n.
  // x rows are k apart (x_stride = k unless given).
  void linear(const __nv_bfloat16* x, int64_t m, int64_t k, const __nv_bfloat16* w, int64_t n, void* y,
              Output output, int64_t y_stride, float beta = 0.0f, int64_t x_stride = 0);

 private:
  cublasHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
};

}  // namespace loom::cuda
