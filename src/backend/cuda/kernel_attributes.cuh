// A kernel's opt-in to more than 48 KB of dynamic shared memory, for the .cu
// files. cudaFuncSetAttribute is per device: a kernel must opt in on every GPU
// it runs on (a tensor-parallel group's ranks launch the same kernels on
// different GPUs from their own threads), so the once-only flag is per
// (kernel, device). Thread-safe; a failed call is retried by the next launch.
#pragma once

#include <array>
#include <cstddef>
#include <mutex>

#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"

namespace loom::cuda {

// Call on the launching thread (its current device is the one the kernel runs on), before the launch.
template <auto kKernel>
void allow_dynamic_shared_memory(size_t bytes) {
  constexpr int kDevices = 64;
  static std::array<std::once_flag, kDevices> flags;
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  auto set = [bytes] {
    LOOM_CUDA_CHECK(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  };
  if (device < 0 || device >= kDevices) return set();  // past the table: every launch sets it
  std::call_once(flags[device], set);
}

}  // namespace loom::cuda
