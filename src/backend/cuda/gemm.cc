#include "backend/cuda/gemm.h"

#include "backend/cuda/cuda_check.h"

namespace loom::cuda {

namespace {
constexpr size_t kWorkspaceBytes = 32u << 20;  // cuBLAS's recommendation for Hopper
}

Gemm::Gemm(cudaStream_t stream) {
  LOOM_CUBLAS_CHECK(cublasCreate(&handle_));
  workspace_.allocate(kWorkspaceBytes);
  LOOM_CUBLAS_CHECK(cublasSetStream(handle_, stream));
  LOOM_CUBLAS_CHECK(cublasSetWorkspace(handle_, workspace_.data(), kWorkspaceBytes));
  LOOM_CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
}

Gemm::~Gemm() {
  if (handle_ != nullptr) cublasDestroy(handle_);
}

void Gemm::linear(const __nv_bfloat16* x, int64_t m, int64_t k, const __nv_bfloat16* w, int64_t n, void* y,
                  Output output, int64_t y_stride, float beta, int64_t x_stride) {
  if (m == 0 || n == 0) return;
  const float alpha = 1.0f;
  // Column-major view: Y^T[n, m] = W^T... i.e. C(n x m) = op(W)(n x k) * X^T(k x m),
  // with W stored as a k x n column-major matrix (ld k) and X as k x m (ld x_stride).
  LOOM_CUBLAS_CHECK(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                                 static_cast<int>(k), &alpha, w, CUDA_R_16BF, static_cast<int>(k), x, CUDA_R_16BF,
                                 static_cast<int>(x_stride > 0 ? x_stride : k), &beta, y,
                                 output == Output::kF32 ? CUDA_R_32F : CUDA_R_16BF, static_cast<int>(y_stride),
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace loom::cuda
