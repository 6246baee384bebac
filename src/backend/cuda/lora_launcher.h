// The adapters bound to the CUDA backend's slots (on the device: device_lora.h)
// and the batched LoRA of each projection group of a step (lora.cu's kernels).
//
// A group's LoRA reads the group's input x and writes its own output (a row per
// LoRA row, [LoRA rows, group width]: fp32, bf16 for gate/up), which the
// group's consumer adds. With CudaTuning::lora_side_stream it runs on a second
// stream beside the base GEMM: begin() forks from the main stream, end() joins.
// Owns the adapters (shared), the side stream, its events and the scratch.
//
// Thread: the engine thread.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/device_lora.h"
#include "backend/cuda/device_plan.h"
#include "backend/cuda/kernels.h"
#include "lora/adapter.h"
#include "model/config.h"
#ifdef LOOM_CUDA_MEASURE
#include "backend/cuda/measure_switches.h"
#endif

namespace loom::cuda {

class LoraLauncher {
 public:
  LoraLauncher(const ModelConfig& config, int32_t num_slots, bool side_stream);
  ~LoraLauncher();
  LoraLauncher(const LoraLauncher&) = delete;
  LoraLauncher& operator=(const LoraLauncher&) = delete;

  // Validates `adapter` against the model and kLoraMaxRank, then uploads it
  // (nullptr frees the slot). Error(kInvalidArgument / kUnsupported).
  void set_adapter(int32_t slot, std::shared_ptr<const LoraAdapter> adapter, cudaStream_t stream);
  int32_t num_slots() const { return static_cast<int32_t>(adapters_.size()); }
  const std::vector<std::shared_ptr<const LoraAdapter>>& adapters() const { return adapters_; }
  // Largest k/v LoRA rank of the slot's adapter (ResidualAttention's rank tier).
  int32_t kv_rank(int32_t slot) const { return kv_rank_of_slot_[slot]; }
  // [slot][layer][kNumLoraTargets] on the device.
  const LoraModuleRef* device_table() const { return table_.device_table(); }

  // Sizes the scratch for `plan`'s LoRA rows (before the step's launches).
  void prepare(const StepPlan& plan);
  // True when the step's groups fork a side stream (such steps keep plain launches).
  bool forks(const StepPlan& plan) const;
  // The scratch of the step: shrink sums v [3][splits][LoRA rows][max_rank] fp32.
  float* shrink_sums() const { return v_.as<float>(); }
  int32_t max_rank() const { return max_rank_; }
  int32_t max_splits() const { return max_splits_; }
  bool gate_up_bf16() const;

  // Enqueues the LoRA of the group whose targets are `targets` over input x
  // (row t at x + t * x_stride, `width` output columns) for `layer`; `main` is
  // where the step's own kernels go. Returns what end() needs.
  enum class Pending { kNone, kInline, kSide };
  Pending begin(const DevicePlan& plan, int layer, std::initializer_list<LoraTarget> targets, const __nv_bfloat16* x,
                int32_t x_stride, int32_t width, Launch main);
  // The group's output (nullptr for kNone), after making `main` wait for a side launch.
  const float* end(Pending pending, cudaStream_t main);

  // Device addresses a captured step holds.
  std::vector<const void*> buffers() const { return {v_.data(), out_.data(), table_.device_table()}; }

#ifdef LOOM_CUDA_MEASURE
  CudaMeasureSwitches& measure() { return measure_; }
#endif

 private:
  // shrink_sums_read: the rCache writes read this group's shrink sums (QkvParams::lora_v).
  void launch_group(int group, const LoraParams& params, Launch launch, bool shrink_sums_read);

  const ModelConfig config_;
  const bool side_stream_;
  std::vector<std::shared_ptr<const LoraAdapter>> adapters_;
  std::vector<int32_t> kv_rank_of_slot_;
  DeviceLoraTable table_;
  int32_t max_rank_ = 0;    // of the bound adapters, at the last prepare()
  int32_t max_splits_ = 0;  // shrink chunks of the widest LoRA input
  DeviceBuffer v_;
  DeviceBuffer out_;  // [LoRA rows, widest group] fp32 (gate/up: bf16)
  cudaStream_t stream_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
#ifdef LOOM_CUDA_MEASURE
  CudaMeasureSwitches measure_;
#endif
};

}  // namespace loom::cuda
