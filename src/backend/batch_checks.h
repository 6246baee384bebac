// Input checks shared by the backends (CPU and CUDA): a batch, adapter or weights the backend cannot run
// raises Error(kInvalidArgument) naming the offending field, before any KV
// slot is written, so a bad batch never corrupts the cache or crashes.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "lora/adapter.h"
#include "model/config.h"
#include "model/weights.h"

namespace loom {

struct BatchLimits {
  int32_t vocab_size = 0;
  int32_t num_kv_blocks = 0;  // 0: no KV cache allocated yet
  int32_t block_size = 0;
  int32_t num_residual_blocks = 0;  // 0: no rCache allocated (forked sequences rejected)
  int32_t residual_block_size = 0;
  int32_t residual_max_rank = 0;
  bool has_qk_norm = false;  // forked sharing is unsupported on such models
};

// Checks that the arrays have consistent sizes, sequences lie back to back over
// the tokens, block tables cover every sequence and name existing blocks, token
// ids are in the vocabulary, positions are non-negative, and every adapter slot
// is -1 or bound in `adapters`. Sharing fields (backend.h): present-token counts
// within the sequence's entries; decoder/forked slots -1 or bound, never both;
// a base-mode sequence's tokens on slot -1; a forked sequence's tokens on its
// forked slot at positions equal to their KV index, its residual block table
// covering its entries inside the rCache, its adapter's k/v ranks within the
// rCache's max rank. Error(kUnsupported) for forked sequences on q/k-norm models.
void validate_batch(const Batch& batch, const BatchLimits& limits,
                    const std::vector<std::shared_ptr<const LoraAdapter>>& adapters);

// Checks that `adapter` fits `config`: one entry per layer, and each present
// module has A [rank, in] and B [out, rank] with rank > 0.
void validate_adapter(const LoraAdapter& adapter, const ModelConfig& config);

// Checks that every tensor the forward pass reads is present with the shape
// `config` implies (biases and q/k norms only where the config asks for them).
// Throws Error(kFormat) naming the tensor.
void validate_weights(const ModelWeights& weights, const ModelConfig& config);

}  // namespace loom
