// Measurement-only variants of the CUDA backend, for bench/cuda: compiled only
// into the benchmark's build of the backend (LOOM_CUDA_MEASURE defined: the
// library loom_cuda_measure). The serving build has none of these switches nor
// the kernels they pick. Figures: bench/README.md, "GPU speed".
#pragma once

#ifndef LOOM_CUDA_MEASURE
#error "measure_switches.h belongs to the benchmark's build of the CUDA backend (LOOM_CUDA_MEASURE)"
#endif

#include <cstdint>

namespace loom::cuda {

struct CudaMeasureSwitches {
  // Which LoRA kernels run each projection group: the split shrink + expand
  // pair (serving's), one fused launch per group, or fused for q/k/v and o only.
  enum class LoraKernel { kSplit, kFused, kFusedAttention };
  LoraKernel lora_kernel = LoraKernel::kSplit;
  // The split path's expand as a programmatic dependent launch of its shrink.
  bool lora_pdl_expand = false;
  // With CudaTuning::lora_side_stream: bit g set = projection group g (0 q/k/v,
  // 1 o, 2 gate/up, 3 down) on the side stream, clear = inline after its GEMM.
  uint32_t lora_side_groups = 0xF;
  // gate/up's LoRA delta in fp32 rather than serving's bf16.
  bool lora_f32_gate_up = false;
  // Output columns per thread of the split path's expand kernel (1, 2 or 4;
  // 0: one column per thread, 128 threads per CTA).
  int32_t lora_expand_columns = 1;
  // Launches left out to time what each costs a step (results wrong while any
  // is): bit 2g skips group g's shrink, bit 2g+1 its expand.
  uint32_t lora_skip = 0;
  // Kernels of the step left out, to time what each kind costs a graph step
  // (results wrong while any is): layer_runner.h's StepKernelBits.
  uint32_t skip_kernels = 0;
};

}  // namespace loom::cuda
