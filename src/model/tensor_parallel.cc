#include "model/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "formats/gguf_dequant.h"
#include "util/error.h"

namespace loom {

namespace {

bool is_power_of_two(int32_t value) { return value > 0 && (value & (value - 1)) == 0; }

// Bytes per element of rows sliced in place: 16-bit or e4m3; 0 for GGUF blocks.
int64_t element_bytes(const Tensor& tensor) {
  if (tensor.is_fp8()) return 1;
  const auto type = static_cast<GgmlType>(tensor.quantized.ggml_type);
  return type == GgmlType::kF16 || type == GgmlType::kBF16 ? 2 : 0;
}

// Shards are cut from fp32 tensors, 16-bit or e4m3 rows (sliced in place), not from GGUF blocks.
void require_sliceable(const Tensor& tensor, const std::string& what) {
  if (tensor.is_quantized() && element_bytes(tensor) == 0)
    throw Error(ErrorKind::kUnsupported,
                fmt::format("tensor parallelism: {} is kept in the block format {}; shards are cut from fp32, "
                            "16-bit or FP8 weights",
                            what, ggml_type_name(tensor.quantized.ggml_type)),
                "on the CPU, load the model with --cpu-precision fp32");
}

}  // namespace

void check_tensor_parallel_size(const ModelConfig& config, int32_t size) {
  if (!is_power_of_two(size))
    fail(ErrorKind::kInvalidArgument, "--tensor-parallel-size {}: must be a power of two (1, 2, 4, 8)", size);
  if (config.num_heads % size != 0)
    fail(ErrorKind::kInvalidArgument,
         "--tensor-parallel-size {}: the model's {} attention heads do not split evenly over {} ranks", size,
         config.num_heads, size);
  if (config.num_kv_heads % size != 0 && size % config.num_kv_heads != 0)
    fail(ErrorKind::kInvalidArgument,
         "--tensor-parallel-size {}: the model's {} kv heads can neither be split over nor replicated across {} "
         "ranks",
         size, config.num_kv_heads, size);
  if (config.intermediate_size % size != 0)
    fail(ErrorKind::kInvalidArgument,
         "--tensor-parallel-size {}: the model's intermediate size {} does not split evenly over {} ranks", size,
         config.intermediate_size, size);
}

TensorParallelShard tensor_parallel_shard(const ModelConfig& config, int32_t rank, int32_t size) {
  check_tensor_parallel_size(config, size);
  LOOM_CHECK(rank >= 0 && rank < size);
  TensorParallelShard shard;
  shard.rank = rank;
  shard.size = size;
  shard.num_q_heads = config.num_heads / size;
  shard.q_head_begin = rank * shard.num_q_heads;
  if (config.num_kv_heads >= size) {
    shard.num_kv_heads = config.num_kv_heads / size;
    shard.kv_head_begin = rank * shard.num_kv_heads;
  } else {
    shard.num_kv_heads = 1;
    shard.kv_head_begin = rank / (size / config.num_kv_heads);  // the kv head its query heads read
  }
  shard.intermediate_size = config.intermediate_size / size;
  shard.intermediate_begin = rank * shard.intermediate_size;
  const int32_t per_rank = (config.vocab_size + size - 1) / size;
  shard.vocab_begin = std::min(config.vocab_size, rank * per_rank);
  shard.vocab_end = std::min(config.vocab_size, (rank + 1) * per_rank);
  shard.adds_o_bias = rank == 0;
  return shard;
}

ModelConfig rank_config(const ModelConfig& config, const TensorParallelShard& shard) {
  ModelConfig rank = config;
  rank.num_heads = shard.num_q_heads;
  rank.num_kv_heads = shard.num_kv_heads;
  rank.intermediate_size = shard.intermediate_size;
  rank.vocab_size = shard.vocab_slice();
  rank.o_bias = config.o_bias && shard.adds_o_bias;
  return rank;
}

Tensor slice_rows(const Tensor& tensor, int64_t begin, int64_t end) {
  require_sliceable(tensor, "a sliced tensor");
  LOOM_CHECK(!tensor.shape.empty() && begin >= 0 && begin <= end && end <= tensor.shape[0]);
  Tensor slice = tensor;
  slice.shape[0] = end - begin;
  if (tensor.is_quantized()) {
    slice.quantized.bytes = tensor.quantized.bytes + begin * tensor.quantized.row_bytes;
    if (tensor.quantized.fp8.rows != nullptr) slice.quantized.fp8.rows = tensor.quantized.fp8.rows + begin;
    return slice;
  }
  const int64_t row_elements = tensor.shape.size() == 1 ? 1 : tensor.numel() / tensor.shape[0];
  slice.data = tensor.data + begin * row_elements;
  return slice;
}

Tensor slice_columns(const Tensor& tensor, int64_t begin, int64_t end) {
  require_sliceable(tensor, "a sliced tensor");
  LOOM_CHECK(tensor.shape.size() == 2 && begin >= 0 && begin <= end && end <= tensor.shape[1]);
  if (tensor.is_quantized()) {  // 16-bit or e4m3 rows: a view keeping the whole tensor's row stride (and row scales)
    Tensor slice = tensor;
    slice.shape[1] = end - begin;
    slice.quantized.bytes = tensor.quantized.bytes + begin * element_bytes(tensor);
    return slice;
  }
  const int64_t rows = tensor.shape[0];
  const int64_t columns = end - begin;
  std::vector<float> values(rows * columns);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(values.data() + r * columns, tensor.data + r * tensor.shape[1] + begin, columns * sizeof(float));
  return Tensor::from_vector({rows, columns}, std::move(values));
}

TensorParallelSlice tensor_parallel_slice(const ModelConfig& config, const TensorParallelShard& shard,
                                          const std::string& name) {
  using Kind = TensorParallelSlice::Kind;
  const int64_t head_dim = config.head_dim;
  const int64_t q_begin = shard.q_head_begin * head_dim, q_end = q_begin + shard.num_q_heads * head_dim;
  const int64_t kv_begin = shard.kv_head_begin * head_dim, kv_end = kv_begin + shard.num_kv_heads * head_dim;
  const int64_t ff_begin = shard.intermediate_begin, ff_end = ff_begin + shard.intermediate_size;
  auto ends_with = [&name](std::string_view suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight")
    return {Kind::kRows, shard.vocab_begin, shard.vocab_end};
  if (ends_with(".self_attn.q_proj.weight") || ends_with(".self_attn.q_proj.bias")) return {Kind::kRows, q_begin, q_end};
  if (ends_with(".self_attn.k_proj.weight") || ends_with(".self_attn.k_proj.bias") ||
      ends_with(".self_attn.v_proj.weight") || ends_with(".self_attn.v_proj.bias"))
    return {Kind::kRows, kv_begin, kv_end};
  if (ends_with(".self_attn.o_proj.weight")) return {Kind::kColumns, q_begin, q_end};
  if (ends_with(".self_attn.o_proj.bias")) return {shard.adds_o_bias ? Kind::kWhole : Kind::kNone, 0, 0};
  if (ends_with(".mlp.gate_proj.weight") || ends_with(".mlp.up_proj.weight")) return {Kind::kRows, ff_begin, ff_end};
  if (ends_with(".mlp.down_proj.weight")) return {Kind::kColumns, ff_begin, ff_end};
  return {};  // norms (q/k norms act per head_dim): replicated
}

ModelWeights shard_model_weights(const ModelConfig& config, const ModelWeights& weights,
                                 const TensorParallelShard& shard) {
  for (const auto& [name, tensor] : model_weights_to_tensor_map(config, weights)) require_sliceable(tensor, name);
  // Every cut is tensor_parallel_slice's, by the tensor's HF name (the one place that says how a tensor shards).
  auto cut = [&](const Tensor& tensor, const std::string& name) -> Tensor {
    if (tensor.empty()) return {};  // an optional tensor the config does not have
    const TensorParallelSlice slice = tensor_parallel_slice(config, shard, name);
    switch (slice.kind) {
      case TensorParallelSlice::Kind::kRows: return slice_rows(tensor, slice.begin, slice.end);
      case TensorParallelSlice::Kind::kColumns: return slice_columns(tensor, slice.begin, slice.end);
      case TensorParallelSlice::Kind::kNone: return {};
      case TensorParallelSlice::Kind::kWhole: break;
    }
    return tensor;
  };

  ModelWeights rank;
  rank.embed_tokens = cut(weights.embed_tokens, "model.embed_tokens.weight");
  rank.lm_head = cut(weights.lm_head, "lm_head.weight");
  rank.final_norm = weights.final_norm;
  rank.layers.reserve(weights.layers.size());
  for (size_t i = 0; i < weights.layers.size(); ++i) {
    const LayerWeights& layer = weights.layers[i];
    const std::string prefix = "model.layers." + std::to_string(i) + ".";
    LayerWeights part;
    part.input_norm = cut(layer.input_norm, prefix + "input_layernorm.weight");
    part.post_attention_norm = cut(layer.post_attention_norm, prefix + "post_attention_layernorm.weight");
    part.q_norm = cut(layer.q_norm, prefix + "self_attn.q_norm.weight");
    part.k_norm = cut(layer.k_norm, prefix + "self_attn.k_norm.weight");
    part.q_proj = cut(layer.q_proj, prefix + "self_attn.q_proj.weight");
    part.k_proj = cut(layer.k_proj, prefix + "self_attn.k_proj.weight");
    part.v_proj = cut(layer.v_proj, prefix + "self_attn.v_proj.weight");
    part.q_bias = cut(layer.q_bias, prefix + "self_attn.q_proj.bias");
    part.k_bias = cut(layer.k_bias, prefix + "self_attn.k_proj.bias");
    part.v_bias = cut(layer.v_bias, prefix + "self_attn.v_proj.bias");
    part.o_proj = cut(layer.o_proj, prefix + "self_attn.o_proj.weight");
    part.o_bias = cut(layer.o_bias, prefix + "self_attn.o_proj.bias");
    part.gate_proj = cut(layer.gate_proj, prefix + "mlp.gate_proj.weight");
    part.up_proj = cut(layer.up_proj, prefix + "mlp.up_proj.weight");
    part.down_proj = cut(layer.down_proj, prefix + "mlp.down_proj.weight");
    part.k_cache_scale = layer.k_cache_scale;  // per tensor: every rank's heads share them
    part.v_cache_scale = layer.v_cache_scale;
    rank.layers.push_back(std::move(part));
  }
  return rank;
}

}  // namespace loom
