// Every CUDA runtime and cuBLAS call goes through these: a failure becomes a
// loom::Error naming the call, the file and line (kCapacity for out-of-memory,
// kInternal otherwise), never an abort. Kernel launches are checked with
// LOOM_CUDA_CHECK_LAUNCH() right after the <<<>>> (cudaGetLastError).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace loom::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line);
// Error(kUnsupported, "<what>: <value>") for .cu files (which do not include util/error.h).
[[noreturn]] void throw_unsupported(const char* what, long long value);

}  // namespace loom::cuda

#define LOOM_CUDA_CHECK(call)                                                          \
  do {                                                                                 \
    const cudaError_t loom_cuda_status_ = (call);                                      \
    if (loom_cuda_status_ != cudaSuccess)                                              \
      ::loom::cuda::throw_cuda_error(loom_cuda_status_, #call, __FILE__, __LINE__);    \
  } while (0)

#define LOOM_CUDA_CHECK_LAUNCH() LOOM_CUDA_CHECK(cudaGetLastError())

#define LOOM_CUBLAS_CHECK(call)                                                        \
  do {                                                                                 \
    const cublasStatus_t loom_cublas_status_ = (call);                                 \
    if (loom_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                  \
      ::loom::cuda::throw_cublas_error(loom_cublas_status_, #call, __FILE__, __LINE__); \
  } while (0)
