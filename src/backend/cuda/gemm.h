// Dense bf16 GEMMs through cuBLASLt: Y[m, n] = X[m, k] W[n, k]^T, torch.nn.Linear
// on row-major tensors, fp32 accumulation, fp32 or bf16 output.
//
// Algorithm: cuBLASLt's top heuristic for the shape, looked up once per shape
// and kept in a cache of at most kMaxAlgos shapes (full: it starts over; the
// shapes a server meets are a few per row count, so that is rare).
// (Timing the top candidates per decode shape instead gained nothing: bench/README.md,
// "The measurements behind the CUDA defaults".)
// Owns its handle and a fixed workspace (graph capture never allocates).
// Thread: the owning backend's thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <tuple>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "backend/cuda/device_buffer.h"
#include "util/cache_gauge.h"

namespace loom::cuda {

class Gemm {
 public:
  explicit Gemm(cudaStream_t stream);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  enum class Output { kF32, kBF16 };

  // y[row * y_stride + col] = x[row, :] . w[col, :] for row < m, col < n
  // (x rows x_stride apart; x_stride = k when 0).
  void linear(const __nv_bfloat16* x, int64_t m, int64_t k, const __nv_bfloat16* w, int64_t n, void* y,
              Output output, int64_t y_stride, int64_t x_stride = 0);

  // FP8 (e4m3) W8A8: y[row * y_stride + col] = x_scale * w_scale(col) *
  // (xq[row, :] . wq[col, :]) with xq [m, k] and wq [n, k] dense e4m3, fp32
  // accumulation. x_scale is one fp32 (device) for the whole activation; w_scale
  // (device) is one fp32 (kTensor: cuBLASLt's scalar A scale) or n of them
  // (kChannel: a per-output-channel alpha vector).
  enum class Fp8Scaling { kTensor, kChannel };
  // Whether cuBLASLt has an FP8 kernel for the shape and scaling (it needs k and
  // the output's row bytes multiples of 16); cached per shape. Ask before
  // quantizing the activations: linear_fp8 throws on a shape this refuses.
  bool supports_fp8(int64_t m, int64_t k, int64_t n, Output output, int64_t y_stride, Fp8Scaling scaling);
  void linear_fp8(const uint8_t* xq, const float* x_scale, int64_t m, int64_t k, const uint8_t* wq,
                  const float* w_scale, Fp8Scaling scaling, int64_t n, void* y, Output output, int64_t y_stride);

  static constexpr size_t kMaxAlgos = 4096;
  CacheGauge cache_gauge() const;  // "cublas_algos"

 private:
  // m n k output x_stride y_stride; output + 2 (kTensor) or + 4 (kChannel) for FP8 inputs.
  using ShapeKey = std::tuple<int64_t, int64_t, int64_t, int, int64_t, int64_t>;
  // The cached top algorithm for the shape; nullptr when cuBLASLt has none.
  const cublasLtMatmulAlgo_t* choose_algo(const ShapeKey& key, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                          cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c);

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer workspace_;
  std::map<ShapeKey, std::optional<cublasLtMatmulAlgo_t>> algos_;
  int64_t evictions_ = 0;
};

}  // namespace loom::cuda
