// A step's plan (step_plan.h) and its copy on the device. Owns the pinned and
// device copies of the plan's words; a pointer() stays valid until the next
// upload() grows the device buffer (CudaBackend then drops its graphs).
//
// Thread: the engine thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/step_plan.h"

namespace loom::cuda {

class DevicePlan {
 public:
  DevicePlan();
  ~DevicePlan();
  DevicePlan(const DevicePlan&) = delete;
  DevicePlan& operator=(const DevicePlan&) = delete;

  StepPlan& plan() { return plan_; }
  const StepPlan& plan() const { return plan_; }

  // Copies the plan's words to the device on `stream`. Steps may be enqueued
  // back to back: outside a capture it first waits until the previous upload
  // has left the pinned copy. A captured graph replays the copy from the pinned
  // buffer as it is at launch time, so the caller refills it (upload again)
  // before each replay.
  void upload(cudaStream_t stream);

  // The device address of a plan section (PlanSections' word offsets).
  template <typename T>
  T* pointer(size_t section) const {
    return reinterpret_cast<T*>(device_.as<int32_t>() + section);
  }
  const void* device_data() const { return device_.data(); }

 private:
  StepPlan plan_;
  PinnedBuffer host_;
  DeviceBuffer device_;
  cudaEvent_t copied_ = nullptr;  // the last upload from host_ is done once this fires
};

}  // namespace loom::cuda
