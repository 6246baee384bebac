// A linear weight quantized to FP8 as llm-compressor writes one: e4m3 rows
// (the checkpoint's F8_E4M3 tensor, kF8E4M3RowType) with one scale per output
// row (kChannel) or per module (kTensor), scale = max |w| / 448, each scale
// rounded through `round_scale` (the checkpoint's stored precision of it).
// Shared by the CPU checkpoint tests and the GPU FP8 tests.
#pragma once

#include <functional>
#include <vector>

#include "formats/tensor.h"

namespace loom::test {

struct Fp8Linear {
  Tensor rows;                    // e4m3 bytes, shape of the source; owns them
  std::vector<float> scales;      // one per row (all equal for kTensor), as stored
  std::vector<float> dequantized; // e4m3 x scale, row-major: what a backend must run
};

// `weight` is an fp32 [rows, columns] matrix.
Fp8Linear quantize_fp8_linear(const Tensor& weight, bool per_channel,
                              const std::function<float(float)>& round_scale = [](float scale) { return scale; });

}  // namespace loom::test
