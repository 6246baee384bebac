// LoRA adapters on the GPU: one allocation per bound slot holding every module's
// A and B in bf16, and a device table [slot][layer][target] of LoraModuleRef
// (plan_types.h) that the LoRA kernels index by slot.
// Thread: the owning backend's thread, between forward passes (set() copies
// synchronously, so a running forward must have finished).
#pragma once

#include <cstdint>
#include <vector>

#include <cuda_runtime_api.h>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/plan_types.h"
#include "lora/adapter.h"
#include "model/config.h"

namespace loom::cuda {

class DeviceLoraTable {
 public:
  DeviceLoraTable(int32_t num_slots, const ModelConfig& config);

  // Uploads `adapter` (validated by the caller) into `slot`; nullptr frees the slot.
  void set(int32_t slot, const LoraAdapter* adapter, cudaStream_t stream);

  const LoraModuleRef* device_table() const { return table_.as<const LoraModuleRef>(); }
  // Largest rank of any bound module (0 when none is bound).
  int32_t max_rank() const;

 private:
  ModelConfig config_;
  int32_t num_slots_;
  std::vector<DeviceBuffer> storage_;       // [slot]
  std::vector<LoraModuleRef> host_table_;   // [slot][layer][kNumLoraTargets]
  std::vector<int32_t> slot_max_rank_;      // [slot]
  DeviceBuffer table_;
};

}  // namespace loom::cuda
