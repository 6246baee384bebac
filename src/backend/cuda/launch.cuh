// Kernel launches with an optional programmatic dependent launch (PDL, sm_90),
// for the .cu files. With Launch::programmatic a kernel may begin while the
// stream's previous kernel still runs, once every CTA of that one has called
// pdl_trigger() (or exited): its launch and prologue (a weight prefetch, say)
// hide behind the previous kernel's tail. Such a kernel must call pdl_wait() in
// every CTA, on every path, before it reads or writes anything another kernel
// touches: the wait returns once the previous grid has completed with its writes
// visible, and as that grid waited for its own predecessor the order is
// transitive. Launched plainly, both calls are no-ops.
#pragma once

#include <utility>

#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace loom::cuda {

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

template <typename... Params, typename... Args>
void launch_kernel(const Launch& launch, dim3 grid, dim3 block, size_t shared_bytes, void (*kernel)(Params...),
                   Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = launch.stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = launch.programmatic ? 1 : 0;
  LOOM_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace loom::cuda
