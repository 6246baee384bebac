#include "model/weights.h"

#include <fmt/ranges.h>

#include "util/error.h"

namespace loom {

namespace {

class TensorPicker {
 public:
  TensorPicker(const TensorMap& tensors, const std::string& source)
      : tensors_(tensors), source_(source) {}

  bool has(const std::string& name) const { return tensors_.count(name) != 0; }

  Tensor require(const std::string& name, std::vector<int64_t> expected_shape) const {
    auto found = tensors_.find(name);
    if (found == tensors_.end())
      fail(ErrorKind::kNotFound, "{}: missing tensor {} (expected shape [{}])", source_, name,
           fmt::join(expected_shape, ", "));
    const Tensor& tensor = found->second;
    if (tensor.shape != expected_shape)
      fail(ErrorKind::kFormat, "{}: tensor {} has shape [{}], expected [{}]", source_, name,
           fmt::join(tensor.shape, ", "), fmt::join(expected_shape, ", "));
    if (tensor.empty() && tensor.numel() > 0)
      fail(ErrorKind::kFormat, "{}: tensor {} has no data", source_, name);
    return tensor;
  }

 private:
  const TensorMap& tensors_;
  const std::string& source_;
};

std::string layer_prefix(int layer) { return fmt::format("model.layers.{}.", layer); }

}  // namespace

ModelWeights build_model_weights(const ModelConfig& config, const TensorMap& tensors,
                                 const std::string& source) {
  config.validate(source);
  TensorPicker picker(tensors, source);
  const int64_t hidden = config.hidden_size;
  const int64_t vocab = config.vocab_size;
  const int64_t q_size = config.q_size();
  const int64_t kv_size = config.kv_size();
  const int64_t intermediate = config.intermediate_size;

  ModelWeights weights;
  weights.embed_tokens = picker.require("model.embed_tokens.weight", {vocab, hidden});
  weights.final_norm = picker.require("model.norm.weight", {hidden});
  // Tied checkpoints may still carry a copy of lm_head.weight; transformers ties
  // it to the embedding regardless, so we do the same.
  weights.lm_head = config.tie_word_embeddings ? weights.embed_tokens
                                               : picker.require("lm_head.weight", {vocab, hidden});

  weights.layers.resize(config.num_layers);
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const std::string prefix = layer_prefix(layer);
    const std::string attention = prefix + "self_attn.";
    LayerWeights& out = weights.layers[layer];
    out.input_norm = picker.require(prefix + "input_layernorm.weight", {hidden});
    out.q_proj = picker.require(attention + "q_proj.weight", {q_size, hidden});
    out.k_proj = picker.require(attention + "k_proj.weight", {kv_size, hidden});
    out.v_proj = picker.require(attention + "v_proj.weight", {kv_size, hidden});
    out.o_proj = picker.require(attention + "o_proj.weight", {hidden, q_size});
    if (config.qkv_bias) {
      out.q_bias = picker.require(attention + "q_proj.bias", {q_size});
      out.k_bias = picker.require(attention + "k_proj.bias", {kv_size});
      out.v_bias = picker.require(attention + "v_proj.bias", {kv_size});
    }
    if (config.o_bias) out.o_bias = picker.require(attention + "o_proj.bias", {hidden});
    if (config.qk_norm) {
      out.q_norm = picker.require(attention + "q_norm.weight", {config.head_dim});
      out.k_norm = picker.require(attention + "k_norm.weight", {config.head_dim});
    }
    out.post_attention_norm = picker.require(prefix + "post_attention_layernorm.weight", {hidden});
    out.gate_proj = picker.require(prefix + "mlp.gate_proj.weight", {intermediate, hidden});
    out.up_proj = picker.require(prefix + "mlp.up_proj.weight", {intermediate, hidden});
    out.down_proj = picker.require(prefix + "mlp.down_proj.weight", {hidden, intermediate});
  }
  return weights;
}

bool has_quantized_tensors(const ModelWeights& weights) {
  if (weights.embed_tokens.is_quantized() || weights.lm_head.is_quantized()) return true;
  for (const LayerWeights& layer : weights.layers)
    for (const Tensor* tensor : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj, &layer.gate_proj,
                                 &layer.up_proj, &layer.down_proj})
      if (tensor->is_quantized()) return true;
  return false;
}

TensorMap model_weights_to_tensor_map(const ModelConfig& config, const ModelWeights& weights) {
  TensorMap tensors;
  auto put = [&](const std::string& name, const Tensor& tensor) {
    if (!tensor.empty()) tensors[name] = tensor;
  };
  put("model.embed_tokens.weight", weights.embed_tokens);
  put("model.norm.weight", weights.final_norm);
  if (!config.tie_word_embeddings) put("lm_head.weight", weights.lm_head);
  for (size_t layer = 0; layer < weights.layers.size(); ++layer) {
    const std::string prefix = layer_prefix(static_cast<int>(layer));
    const std::string attention = prefix + "self_attn.";
    const LayerWeights& in = weights.layers[layer];
    put(prefix + "input_layernorm.weight", in.input_norm);
    put(attention + "q_proj.weight", in.q_proj);
    put(attention + "k_proj.weight", in.k_proj);
    put(attention + "v_proj.weight", in.v_proj);
    put(attention + "o_proj.weight", in.o_proj);
    put(attention + "q_proj.bias", in.q_bias);
    put(attention + "k_proj.bias", in.k_bias);
    put(attention + "v_proj.bias", in.v_bias);
    put(attention + "o_proj.bias", in.o_bias);
    put(attention + "q_norm.weight", in.q_norm);
    put(attention + "k_norm.weight", in.k_norm);
    put(prefix + "post_attention_layernorm.weight", in.post_attention_norm);
    put(prefix + "mlp.gate_proj.weight", in.gate_proj);
    put(prefix + "mlp.up_proj.weight", in.up_proj);
    put(prefix + "mlp.down_proj.weight", in.down_proj);
  }
  return tensors;
}

}  // namespace loom
