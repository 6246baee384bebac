// A LoRA adapter cut for one tensor-parallel rank (model/tensor_parallel.h),
// S-LoRA style, so that LoRA adds no collective of its own:
//   column-parallel targets (q, k, v, gate, up): A whole (the rank has the whole
//     input), B's rows of the rank's outputs;
//   row-parallel targets (o, down): A's columns of the rank's inputs, B whole; the
//     rank's s (x_r A_r^T) B^T is a partial sum that the base projection's
//     all-reduce completes with the base product.
// Forked sharing: the rCache holds x A_k^T and x A_v^T (A whole), so every rank
// keeps the same rCache entries and rebuilds K and V of its kv heads from its
// rows of B_k and B_v.
#pragma once

#include <memory>

#include "lora/adapter.h"
#include "model/tensor_parallel.h"

namespace loom {

// The rank's adapter (name, path and config unchanged; rank and scale per
// module unchanged). The full adapter must fit `config` (validate first).
std::shared_ptr<const LoraAdapter> shard_lora_adapter(const LoraAdapter& adapter, const ModelConfig& config,
                                                      const TensorParallelShard& shard);

}  // namespace loom
