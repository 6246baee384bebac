#include "backend/cuda/gemm.h"

#include "backend/cuda/cuda_check.h"

namespace loom::cuda {

namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;  // cuBLAS's recommendation for Hopper

// RAII for the per-call descriptors (cheap to create; keeps linear() exception-safe).
struct Descriptors {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~Descriptors() {
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};

// The FP8 GEMM's descriptors: the same column-major view as linear() (A = W
// transposed, the "TN" layout FP8 needs), e4m3 inputs, bf16 or fp32 output.
// kTensor: A's and B's scales are scalars (pointers set by linear_fp8);
// kChannel: alpha is a device vector of the n channel scales, B's scale a scalar.
void describe_fp8(Descriptors& d, int64_t m, int64_t k, int64_t n, Gemm::Output output, int64_t y_stride,
                  Gemm::Fp8Scaling scaling) {
  const cudaDataType_t y_type = output == Gemm::Output::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T, no_transpose = CUBLAS_OP_N;
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)));
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_TRANSB, &no_transpose, sizeof(no_transpose)));
  if (scaling == Gemm::Fp8Scaling::kChannel) {
    const int32_t mode = CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO;
    LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &mode, sizeof(mode)));
  }
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_8F_E4M3, k, n, k));
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_8F_E4M3, k, m, k));
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, y_type, n, m, y_stride));
}

int fp8_key(Gemm::Output output, Gemm::Fp8Scaling scaling) {
  return static_cast<int>(output) + (scaling == Gemm::Fp8Scaling::kTensor ? 2 : 4);
}

}  // namespace

Gemm::Gemm(cudaStream_t stream) : stream_(stream) {
  LOOM_CUBLAS_CHECK(cublasLtCreate(&handle_));
  workspace_.allocate(kWorkspaceBytes);
}

Gemm::~Gemm() {
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

const cublasLtMatmulAlgo_t* Gemm::choose_algo(const ShapeKey& key, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c) {
  const auto found = algos_.find(key);
  if (found != algos_.end()) return found->second ? &*found->second : nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const size_t workspace_bytes = kWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                       sizeof(workspace_bytes));
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, desc, a, b, c, c, preference, 1, &result, &returned);
  cublasLtMatmulPreferenceDestroy(preference);
  // An FP8 scaling mode this cuBLASLt lacks can answer INVALID_VALUE: no algorithm, as NOT_SUPPORTED.
  if (status != CUBLAS_STATUS_NOT_SUPPORTED && status != CUBLAS_STATUS_INVALID_VALUE) LOOM_CUBLAS_CHECK(status);
  if (algos_.size() >= kMaxAlgos) {
    evictions_ += static_cast<int64_t>(algos_.size());
    algos_.clear();
  }
  std::optional<cublasLtMatmulAlgo_t>& entry = algos_[key];
  if (status == CUBLAS_STATUS_SUCCESS && returned > 0) entry = result.algo;
  return entry ? &*entry : nullptr;
}

CacheGauge Gemm::cache_gauge() const {
  // A std::map node: the key, the algorithm and about four pointers of bookkeeping.
  constexpr int64_t kEntryBytes = sizeof(ShapeKey) + sizeof(cublasLtMatmulAlgo_t) + 4 * sizeof(void*);
  const auto entries = static_cast<int64_t>(algos_.size());
  return {"cublas_algos", entries, static_cast<int64_t>(kMaxAlgos), entries * kEntryBytes, evictions_};
}

void Gemm::linear(const __nv_bfloat16* x, int64_t m, int64_t k, const __nv_bfloat16* w, int64_t n, void* y,
                  Output output, int64_t y_stride, int64_t x_stride) {
  if (m == 0 || n == 0) return;
  if (x_stride == 0) x_stride = k;
  const cudaDataType_t y_type = output == Output::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  // Column-major view: C (n x m, ld y_stride) = op(A) * B with A = W stored as
  // k x n (ld k), transposed, and B = X stored as k x m (ld x_stride).
  Descriptors d;
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T, no_transpose = CUBLAS_OP_N;
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)));
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_TRANSB, &no_transpose, sizeof(no_transpose)));
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, CUDA_R_16BF, k, n, k));
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, CUDA_R_16BF, k, m, x_stride));
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, y_type, n, m, y_stride));
  const ShapeKey key{m, n, k, static_cast<int>(output), x_stride, y_stride};
  const cublasLtMatmulAlgo_t* algo = choose_algo(key, d.desc, d.a, d.b, d.c);
  if (algo == nullptr) LOOM_CUBLAS_CHECK(CUBLAS_STATUS_NOT_SUPPORTED);
  const float alpha = 1.0f, beta = 0.0f;
  LOOM_CUBLAS_CHECK(cublasLtMatmul(handle_, d.desc, &alpha, w, d.a, x, d.b, &beta, y, d.c, y, d.c, algo,
                                   workspace_.data(), kWorkspaceBytes, stream_));
}

bool Gemm::supports_fp8(int64_t m, int64_t k, int64_t n, Output output, int64_t y_stride, Fp8Scaling scaling) {
  if (m == 0 || n == 0) return true;
  const int64_t y_bytes = output == Output::kF32 ? 4 : 2;
  if (k % 16 != 0 || (y_stride * y_bytes) % 16 != 0) return false;
  const ShapeKey key{m, n, k, fp8_key(output, scaling), k, y_stride};
  // Asked before every FP8 GEMM of a step: a shape seen before needs no descriptors.
  if (const auto found = algos_.find(key); found != algos_.end()) return found->second.has_value();
  Descriptors d;
  describe_fp8(d, m, k, n, output, y_stride, scaling);
  return choose_algo(key, d.desc, d.a, d.b, d.c) != nullptr;
}

void Gemm::linear_fp8(const uint8_t* xq, const float* x_scale, int64_t m, int64_t k, const uint8_t* wq,
                      const float* w_scale, Fp8Scaling scaling, int64_t n, void* y, Output output, int64_t y_stride) {
  if (m == 0 || n == 0) return;
  Descriptors d;
  describe_fp8(d, m, k, n, output, y_stride, scaling);
  if (scaling == Fp8Scaling::kTensor)
    LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scale, sizeof(w_scale)));
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scale, sizeof(x_scale)));
  const cublasLtMatmulAlgo_t* algo = choose_algo({m, n, k, fp8_key(output, scaling), k, y_stride}, d.desc, d.a, d.b, d.c);
  if (algo == nullptr) LOOM_CUBLAS_CHECK(CUBLAS_STATUS_NOT_SUPPORTED);
  const float one = 1.0f, zero = 0.0f;
  const void* alpha = scaling == Fp8Scaling::kChannel ? static_cast<const void*>(w_scale) : &one;
  LOOM_CUBLAS_CHECK(cublasLtMatmul(handle_, d.desc, alpha, wq, d.a, xq, d.b, &zero, y, d.c, y, d.c, algo,
                                   workspace_.data(), kWorkspaceBytes, stream_));
}

}  // namespace loom::cuda
