#include "backend/cuda/device_plan.h"

#include <cstring>

#include "backend/cuda/cuda_check.h"

namespace loom::cuda {

DevicePlan::DevicePlan() { LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming)); }

DevicePlan::~DevicePlan() {
  if (copied_ != nullptr) cudaEventDestroy(copied_);
}

void DevicePlan::upload(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  LOOM_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  const bool capturing = capture != cudaStreamCaptureStatusNone;
  if (!capturing) LOOM_CUDA_CHECK(cudaEventSynchronize(copied_));
  const size_t bytes = plan_.words().size() * sizeof(int32_t);
  device_.reserve(bytes);
  host_.reserve(bytes);
  std::memcpy(host_.data(), plan_.words().data(), bytes);
  LOOM_CUDA_CHECK(cudaMemcpyAsync(device_.data(), host_.data(), bytes, cudaMemcpyHostToDevice, stream));
  if (!capturing) LOOM_CUDA_CHECK(cudaEventRecord(copied_, stream));
}

}  // namespace loom::cuda
