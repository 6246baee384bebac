// The collective a CUDA tensor-parallel rank joins inside its step
// (docs/tensor-parallel.md): an in-place sum over the group's ranks, ordered
// on the rank's stream. One object per rank; the rank's engine thread calls it.
// NCCL's communicators are the production implementation; a group whose ranks
// share one device (tests/cuda) is another.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace loom::cuda {

class DeviceCommunicator {
 public:
  virtual ~DeviceCommunicator() = default;
  // data[0, count) (this rank's device memory) becomes the elementwise sum of
  // every rank's, after the work already on `stream` and before the work
  // enqueued on it next. Every rank calls it with the same count, in the same
  // order. Throws Error when the group ended (another rank failed).
  virtual void all_reduce_sum(float* data, int64_t count, cudaStream_t stream) = 0;
  // Whether all_reduce_sum may be captured into a CUDA graph (else the rank runs eagerly).
  virtual bool capturable() const = 0;
};

}  // namespace loom::cuda
