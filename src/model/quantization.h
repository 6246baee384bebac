// FP8 checkpoints (docs/quantization.md): config.json's `quantization_config`
// as llm-compressor and transformers write it, parsed into the scheme the
// model's linear weights follow (ModelConfig::quantization).
//
//   compressed-tensors (llm-compressor):
//     {"quant_method": "compressed-tensors", "format": "float-quantized",
//      "config_groups": {"group_0": {"targets": ["Linear"],
//          "weights": {"num_bits": 8, "type": "float", "strategy": "tensor"|"channel",
//                      "symmetric": true, "dynamic": false},
//          "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor"|"token",
//                                "dynamic": true|false} or null}},
//      "ignore": ["lm_head", "re:.*mlp.down_proj", ...]}
//     Activations: dynamic per token, dynamic per tensor, static per tensor
//     (symmetric, an `input_scale` per linear), or none (weight-only FP8, W8A16).
//   fbgemm_fp8 (transformers' FbgemmFp8Config, Meta's Llama 3.1 FP8):
//     {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
//      "modules_to_not_convert": ["lm_head", ...]}
//     Per-channel weight scales, dynamic per-token activations whose abs-max is
//     clamped to activation_scale_ub before the scale is taken.
//
// Tensors of a quantized linear `<module>` (model/weights.cc checks them):
//   <module>.weight        F8_E4M3 [out, in]
//   <module>.weight_scale  F32 (or BF16 / F16): [] or [1] (strategy tensor), [out, 1] (channel)
//   <module>.input_scale   [] or [1], static activations only
// Each scale must be finite and > 0. A module the config ignores keeps its
// 16/32-bit weight; lm_head and the embedding are never FP8.
//
// Anything else is refused with Error(kUnsupported) naming the key: other
// quant_methods (gptq, awq, fp8, ...), formats (pack-quantized, ...), num_bits
// other than 8, type int, strategies group / block, asymmetric weights,
// dynamic weights, static per-token activations, targets other than "Linear",
// several config groups with different schemes.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace loom {

enum class QuantizationMethod { kNone, kCompressedTensors, kFbgemmFp8 };

// How a matrix's e4m3 weights are scaled: one scale for the whole matrix, or
// one per output row (channel).
enum class Fp8WeightStrategy { kTensor, kChannel };

// How the activations entering an FP8 linear are quantized to e4m3.
enum class Fp8Activations {
  kNone,              // not at all: weight-only FP8 (W8A16)
  kDynamicPerToken,   // a scale per token, from its abs-max, at run time
  kDynamicPerTensor,  // one scale per step, from the activations' abs-max
  kStaticPerTensor,   // the checkpoint's input_scale per linear (Fp8Scales::input)
};

struct QuantizationScheme {
  QuantizationMethod method = QuantizationMethod::kNone;
  Fp8WeightStrategy weight_strategy = Fp8WeightStrategy::kChannel;
  Fp8Activations activations = Fp8Activations::kNone;
  // fbgemm_fp8: upper bound on a token's abs-max before its scale (abs-max / 448)
  // is taken; 0: none.
  float activation_scale_ub = 0.0f;
  // Modules kept in 16/32 bits, as the config lists them: compressed-tensors'
  // `ignore` (exact names or "re:REGEX", matched from the name's start) or
  // fbgemm_fp8's `modules_to_not_convert` (names, or parts of names as
  // transformers matches them).
  std::vector<std::string> ignore;
  // compressed-tensors' kv_cache_scheme (FP8, static, one scale per tensor):
  // every layer carries self_attn.k_scale and self_attn.v_scale (LayerWeights::
  // k_cache_scale), the scales of an FP8 KV cache (--kv-cache-dtype fp8).
  bool kv_cache_scales = false;

  // The checkpoint's linear weights are FP8.
  bool fp8() const { return method != QuantizationMethod::kNone; }
  // Whether `module` (an HF module name: "model.layers.0.self_attn.q_proj",
  // "lm_head") is left unquantized by the config (IgnoreMatcher, built for the call).
  bool ignores(const std::string& module) const;
  bool static_input_scales() const { return activations == Fp8Activations::kStaticPerTensor; }
};

// QuantizationScheme::ignore with its regular expressions compiled once (PCRE2),
// for asking about every module of a model.
class IgnoreMatcher {
 public:
  explicit IgnoreMatcher(const QuantizationScheme& scheme);
  ~IgnoreMatcher();
  bool ignores(const std::string& module) const;

 private:
  struct Patterns;
  const QuantizationScheme& scheme_;
  std::unique_ptr<Patterns> patterns_;
};

// "compressed-tensors" / "fbgemm_fp8" / "none".
const char* quantization_method_name(QuantizationMethod method);
// "tensor" / "channel".
const char* fp8_weight_strategy_name(Fp8WeightStrategy strategy);
// "none" / "dynamic per token" / "dynamic per tensor" / "static per tensor".
const char* fp8_activations_name(Fp8Activations activations);
// One line for logs and the effective configuration, e.g. "compressed-tensors fp8:
// weights per channel, activations dynamic per token, 1 module ignored".
std::string describe(const QuantizationScheme& scheme);

// Parses the value of config.json's "quantization_config" (`path` names the
// file in errors). Throws Error(kUnsupported) for a scheme Loom does not run
// and Error(kFormat) for missing or ill-typed fields, naming the key.
QuantizationScheme parse_quantization_config(const nlohmann::json& config, const std::string& path);

}  // namespace loom
