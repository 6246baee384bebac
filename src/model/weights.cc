#include "model/weights.h"

#include <algorithm>
#include <array>
#include <cmath>

#include <fmt/ranges.h>

#include "formats/gguf_dequant.h"
#include "util/error.h"

namespace loom {

namespace {

class TensorPicker {
 public:
  TensorPicker(const TensorMap& tensors, const std::string& source, const QuantizationScheme& scheme)
      : tensors_(tensors), source_(source), scheme_(scheme), ignore_(scheme) {}

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

  // A tensor that must not be FP8 (the embedding, lm_head).
  Tensor require_unquantized(const std::string& name, std::vector<int64_t> expected_shape) const {
    Tensor tensor = require(name, std::move(expected_shape));
    if (tensor.is_fp8())
      throw Error(ErrorKind::kUnsupported, fmt::format("{}: tensor {} is F8_E4M3", source_, name),
                  "Loom reads FP8 weights for the linear layers only (q/k/v/o, gate/up/down); keep the embedding and "
                  "lm_head in 16 bits (llm-compressor: ignore [\"lm_head\"])");
    return tensor;
  }

  // The weight of linear `module` ("model.layers.0.self_attn.q_proj"): as stored
  // when the config leaves it unquantized, else its e4m3 rows with their scales
  // attached (Fp8Scales).
  Tensor linear(const std::string& module, std::vector<int64_t> expected_shape) const {
    const std::string name = module + ".weight";
    Tensor weight = require(name, expected_shape);
    const bool quantized = scheme_.fp8() && !ignore_.ignores(module);
    if (!weight.is_fp8()) {
      if (quantized)
        fail(ErrorKind::kFormat,
             "{}: tensor {} is {}, but quantization_config ({}) quantizes {}: expected F8_E4M3 with {}.weight_scale "
             "(or {} in the config's ignore list)",
             source_, name, weight.is_quantized() ? ggml_type_name(weight.quantized.ggml_type) : "not F8_E4M3",
             quantization_method_name(scheme_.method), module, module, module);
      return weight;
    }
    if (!scheme_.fp8())
      throw Error(ErrorKind::kFormat,
                  fmt::format("{}: tensor {} is F8_E4M3 but config.json has no quantization_config", source_, name),
                  "an FP8 checkpoint's config.json says how its scales are stored (compressed-tensors or fbgemm_fp8)");
    if (!quantized)
      fail(ErrorKind::kFormat,
           "{}: tensor {} is F8_E4M3 but quantization_config leaves {} unquantized (listed in {})", source_, name,
           module, scheme_.method == QuantizationMethod::kFbgemmFp8 ? "modules_to_not_convert" : "ignore");
    const int64_t rows = expected_shape[0];
    auto scales = std::make_shared<std::vector<float>>(weight_scales(module, rows));
    weight.quantized.fp8.rows = scales->data();
    weight.quantized.fp8.storage = std::move(scales);
    if (scheme_.static_input_scales()) weight.quantized.fp8.input = input_scale(module);
    return weight;
  }

 private:
  // The scale tensor `name` as fp32 values, which must be finite and > 0.
  std::vector<float> scale_values(const std::string& name, const std::string& what,
                                  const std::vector<std::vector<int64_t>>& shapes) const {
    std::vector<std::string> spelled;
    for (const auto& shape : shapes) spelled.push_back(fmt::format("[{}]", fmt::join(shape, ", ")));
    auto found = tensors_.find(name);
    if (found == tensors_.end())
      fail(ErrorKind::kNotFound, "{}: missing tensor {} ({}, shape {})", source_, name, what, fmt::join(spelled, " or "));
    if (found->second.is_fp8())
      fail(ErrorKind::kFormat, "{}: tensor {} ({}) is F8_E4M3; scales are F32, BF16 or F16", source_, name, what);
    if (std::find(shapes.begin(), shapes.end(), found->second.shape) == shapes.end())
      fail(ErrorKind::kFormat, "{}: tensor {} has shape [{}]; {} needs shape {}", source_, name,
           fmt::join(found->second.shape, ", "), what, fmt::join(spelled, " or "));
    const Tensor values = to_fp32(found->second);
    const int64_t count = values.shape.empty() ? 1 : values.numel();
    if (values.data == nullptr) fail(ErrorKind::kFormat, "{}: tensor {} has no data", source_, name);
    std::vector<float> scales(values.data, values.data + count);
    for (int64_t i = 0; i < count; ++i)
      if (!(std::isfinite(scales[i]) && scales[i] > 0.0f))
        fail(ErrorKind::kFormat, "{}: tensor {} holds {} at index {}; scales must be finite and > 0", source_, name,
             scales[i], i);
    return scales;
  }

  // One scale per row: the channel scales, or the tensor's scale repeated.
  std::vector<float> weight_scales(const std::string& module, int64_t rows) const {
    const std::string name = module + ".weight_scale";
    if (scheme_.weight_strategy == Fp8WeightStrategy::kChannel)
      return scale_values(name, "the FP8 weight's scale per channel", {{rows, 1}});
    const float scale = scale_values(name, "the FP8 weight's scale per tensor", {{}, {1}})[0];
    return std::vector<float>(static_cast<size_t>(rows), scale);
  }

  float input_scale(const std::string& module) const {
    return scale_values(module + ".input_scale", "the static FP8 activation scale", {{}, {1}})[0];
  }

 public:
  // The FP8 KV cache scale `which` ("k" or "v") of the attention module `attention`
  // ("model.layers.0.self_attn."): self_attn.k_scale as llm-compressor writes it, or
  // the older self_attn.k_proj.output_scale.
  float kv_cache_scale(const std::string& attention, const std::string& which) const {
    const std::string name = attention + which + "_scale";
    const std::string older = attention + which + "_proj.output_scale";
    return scale_values(has(name) || !has(older) ? name : older,
                        "the FP8 KV cache's " + which + " scale (kv_cache_scheme)", {{}, {1}})[0];
  }

 private:

  const TensorMap& tensors_;
  const std::string& source_;
  const QuantizationScheme& scheme_;
  const IgnoreMatcher ignore_;
};

std::string layer_prefix(int layer) { return fmt::format("model.layers.{}.", layer); }

}  // namespace

ModelWeights build_model_weights(const ModelConfig& config, const TensorMap& tensors,
                                 const std::string& source) {
  config.validate(source);
  TensorPicker picker(tensors, source, config.quantization);
  const int64_t hidden = config.hidden_size;
  const int64_t vocab = config.vocab_size;
  const int64_t q_size = config.q_size();
  const int64_t kv_size = config.kv_size();
  const int64_t intermediate = config.intermediate_size;

  ModelWeights weights;
  weights.embed_tokens = picker.require_unquantized("model.embed_tokens.weight", {vocab, hidden});
  weights.final_norm = picker.require("model.norm.weight", {hidden});
  // Tied checkpoints may still carry a copy of lm_head.weight; transformers ties
  // it to the embedding regardless, so we do the same.
  weights.lm_head = config.tie_word_embeddings ? weights.embed_tokens
                                               : picker.require_unquantized("lm_head.weight", {vocab, hidden});

  weights.layers.resize(config.num_layers);
  for (int layer = 0; layer < config.num_layers; ++layer) {
    const std::string prefix = layer_prefix(layer);
    const std::string attention = prefix + "self_attn.";
    LayerWeights& out = weights.layers[layer];
    out.input_norm = picker.require(prefix + "input_layernorm.weight", {hidden});
    out.q_proj = picker.linear(attention + "q_proj", {q_size, hidden});
    out.k_proj = picker.linear(attention + "k_proj", {kv_size, hidden});
    out.v_proj = picker.linear(attention + "v_proj", {kv_size, hidden});
    out.o_proj = picker.linear(attention + "o_proj", {hidden, q_size});
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
    out.gate_proj = picker.linear(prefix + "mlp.gate_proj", {intermediate, hidden});
    out.up_proj = picker.linear(prefix + "mlp.up_proj", {intermediate, hidden});
    out.down_proj = picker.linear(prefix + "mlp.down_proj", {hidden, intermediate});
    if (config.quantization.kv_cache_scales) {
      out.k_cache_scale = picker.kv_cache_scale(attention, "k");
      out.v_cache_scale = picker.kv_cache_scale(attention, "v");
    }
  }
  return weights;
}

static std::array<const Tensor*, 7> linear_weights(const LayerWeights& layer) {
  return {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj, &layer.gate_proj, &layer.up_proj,
          &layer.down_proj};
}

bool has_quantized_tensors(const ModelWeights& weights) {
  if (weights.embed_tokens.is_quantized() || weights.lm_head.is_quantized()) return true;
  for (const LayerWeights& layer : weights.layers)
    for (const Tensor* tensor : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj, &layer.gate_proj,
                                 &layer.up_proj, &layer.down_proj})
      if (tensor->is_quantized()) return true;
  return false;
}

bool has_fp8_weights(const ModelWeights& weights) {
  for (const LayerWeights& layer : weights.layers)
    for (const Tensor* tensor : linear_weights(layer))
      if (tensor->is_fp8()) return true;
  return false;
}

ModelWeights dequantize_fp8_weights(const ModelWeights& weights) {
  ModelWeights out = weights;
  for (size_t l = 0; l < out.layers.size(); ++l) {
    LayerWeights& layer = out.layers[l];
    const std::pair<const char*, Tensor*> linears[] = {
        {"self_attn.q_proj", &layer.q_proj}, {"self_attn.k_proj", &layer.k_proj}, {"self_attn.v_proj", &layer.v_proj},
        {"self_attn.o_proj", &layer.o_proj}, {"mlp.gate_proj", &layer.gate_proj}, {"mlp.up_proj", &layer.up_proj},
        {"mlp.down_proj", &layer.down_proj}};
    for (const auto& [name, tensor] : linears) {
      if (!tensor->is_fp8()) continue;
      try {
        *tensor = to_fp32(*tensor);
      } catch (const Error& error) {
        throw Error(error.kind(), fmt::format("{}{}.weight: {}", layer_prefix(static_cast<int>(l)), name, error.message()),
                    error.hint());
      }
    }
  }
  return out;
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
