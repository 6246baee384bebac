// The collectives a CUDA tensor-parallel rank joins inside its step
// (docs/tensor-parallel.md): an in-place sum over the group's ranks (after the
// row-parallel layers), and a gather of the vocabulary-parallel logits; both
// ordered on the rank's stream. One object per rank; the rank's engine thread calls it.
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
  // receive[r * count, (r + 1) * count) becomes rank r's send[0, count), on
  // every rank (device memory; receive holds size * count floats and does not
  // overlap send). Same ordering, count and failure rules as all_reduce_sum.
  virtual void all_gather(const float* send, float* receive, int64_t count, cudaStream_t stream) = 0;
  // Whether the collectives may be captured into a CUDA graph (else the rank runs eagerly).
  virtual bool capturable() const = 0;
};

}  // namespace loom::cuda
