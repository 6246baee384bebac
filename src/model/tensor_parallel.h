// Tensor parallelism (Megatron-LM's layout): what rank r of a group of N holds.
//
//   q/k/v, gate/up   column-parallel: the rank's rows of W (its heads, its
//                    kv heads, its share of the intermediate size) and of the biases
//   o, down          row-parallel: the rank's columns of W; each rank's product is
//                    a partial sum, added up by one all-reduce per projection
//                    (o's bias: rank 0 only, so it is added once)
//   embedding        vocab-parallel: the rank's rows; a token outside them looks up
//                    zeros, and the all-reduce of the residual stream completes it
//   lm_head          vocab-parallel: the rank's rows; each rank computes its slice
//                    of the logits and the group gathers them
//   norms            replicated (q/k norm act per head_dim, so they are too)
//
// Heads: N divides num_heads; rank r takes query heads [r H/N, (r+1) H/N).
// KV heads: when N <= num_kv_heads, N divides them and rank r takes its
// contiguous share; when N > num_kv_heads (N a multiple of it), each kv head is
// replicated over N / num_kv_heads ranks, the one its query heads read (as
// vLLM does). The vocabulary is cut into N slices of ceil(V / N) rows, the last
// shorter (possibly empty).
//
// A rank runs the ordinary decoder layer (layer_spec.h) over rank_config(): the
// model's config with the rank's head counts, intermediate size and vocabulary
// slice, so the backends' shape checks hold for a shard unchanged.
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"
#include "model/weights.h"

namespace loom {

struct TensorParallelShard {
  int32_t rank = 0;
  int32_t size = 1;
  int32_t q_head_begin = 0, num_q_heads = 0;
  int32_t kv_head_begin = 0, num_kv_heads = 0;
  int32_t intermediate_begin = 0, intermediate_size = 0;
  int32_t vocab_begin = 0, vocab_end = 0;  // [vocab_begin, vocab_end): the rank's embedding and lm_head rows
  bool adds_o_bias = true;                 // rank 0 only

  int32_t vocab_slice() const { return vocab_end - vocab_begin; }
};

// Throws Error(kInvalidArgument) naming the model's numbers when `size` is not a
// power of two, does not divide the heads or the intermediate size, or cannot
// share the kv heads (neither divides the other).
void check_tensor_parallel_size(const ModelConfig& config, int32_t size);

// Rank `rank` of `size` (check_tensor_parallel_size first).
TensorParallelShard tensor_parallel_shard(const ModelConfig& config, int32_t rank, int32_t size);

// The config a rank runs: num_heads, num_kv_heads, intermediate_size and
// vocab_size are the shard's; o_bias only on the rank that adds it.
ModelConfig rank_config(const ModelConfig& config, const TensorParallelShard& shard);

// The rank's weights (shapes as rank_config() says). Row slices view the
// model's storage; column slices (o, down) are owned copies of fp32 tensors, or
// views of 16-bit or e4m3 rows keeping the whole row stride
// (QuantizedRows::row_bytes; for the CUDA upload). An FP8 weight's row scales
// follow its rows (a row slice views the rank's share; a column slice keeps
// them all, as each output row keeps its scale) and its static input scale is
// shared. Error(kUnsupported) for a tensor in a GGUF block format.
ModelWeights shard_model_weights(const ModelConfig& config, const ModelWeights& weights,
                                 const TensorParallelShard& shard);

// What rank `shard` holds of the whole model's tensor `name` (an HF name, as
// model_weights_to_tensor_map and synthetic_base_tensor_specs give them): the
// one statement of how each tensor shards, used by shard_model_weights and by
// code that fills a rank's tensors itself (synthetic weights drawn on each
// rank's GPU). begin/end index rows
// (kRows: dimension 0, also of a 1-D bias) or columns (kColumns); kNone: the
// rank has no such tensor (o's bias off rank 0).
struct TensorParallelSlice {
  enum class Kind { kWhole, kRows, kColumns, kNone };
  Kind kind = Kind::kWhole;
  int64_t begin = 0, end = 0;
};
TensorParallelSlice tensor_parallel_slice(const ModelConfig& config, const TensorParallelShard& shard,
                                          const std::string& name);

// Rows [begin, end) of a 2-D (or the elements of a 1-D) tensor, viewing its storage.
Tensor slice_rows(const Tensor& tensor, int64_t begin, int64_t end);
// Columns [begin, end) of a 2-D tensor: an owned copy (fp32) or a strided view (16-bit or e4m3 rows).
Tensor slice_columns(const Tensor& tensor, int64_t begin, int64_t end);

}  // namespace loom
