#include "backend/cuda/cuda_check.h"

#include "util/error.h"

namespace loom::cuda {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  cudaGetLastError();  // clear a sticky-free error so the next call starts clean
  const ErrorKind kind = status == cudaErrorMemoryAllocation ? ErrorKind::kCapacity : ErrorKind::kInternal;
  fail(kind, "cuda: {} failed: {} ({}) at {}:{}", call, cudaGetErrorString(status), cudaGetErrorName(status),
       file, line);
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  const ErrorKind kind = status == CUBLAS_STATUS_ALLOC_FAILED ? ErrorKind::kCapacity : ErrorKind::kInternal;
  fail(kind, "cublas: {} failed: {} at {}:{}", call, cublasGetStatusString(status), file, line);
}

void throw_unsupported(const char* what, long long value) { fail(ErrorKind::kUnsupported, "{}: {}", what, value); }

}  // namespace loom::cuda
