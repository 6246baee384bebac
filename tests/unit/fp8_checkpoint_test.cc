// FP8 checkpoints (model/quantization.h, docs/quantization.md): config.json's
// quantization_config as llm-compressor (compressed-tensors) and transformers'
// fbgemm_fp8 write it, every refusal; the weights' scales (shapes, values, the
// 16-bit/FP8 agreement with the config); and a tiny synthetic model quantized
// here, written as a checkpoint, loaded and run by the CPU backend, which must
// give the logits of the same model with the dequantized weights in fp32.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backend/backend_capabilities.h"
#include "backend/cpu/cpu_backend.h"
#include "engine/kv_identity.h"
#include "formats/safetensors.h"
#include "model/hf_config.h"
#include "model/loader.h"
#include "model/quantization.h"
#include "model/tensor_parallel.h"
#include "reference_model.h"
#include "synthetic/synthetic_model.h"
#include "fp8_test_util.h"
#include "test_util.h"
#include "util/fp8.h"
#include "util/half.h"

#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace loom {
namespace {

using nlohmann::json;
using test::expect_error;
using test::Fp8Linear;
using test::quantize_fp8_linear;
using test::TempDir;

constexpr const char* kPath = "config.json";

// An args object of compressed-tensors (QuantizationArgs) as llm-compressor writes it.
json float8_args(const std::string& strategy, bool dynamic) {
  return {{"num_bits", 8},       {"type", "float"},     {"strategy", strategy}, {"symmetric", true},
          {"dynamic", dynamic},  {"group_size", nullptr}, {"block_structure", nullptr},
          {"actorder", nullptr}, {"observer", dynamic ? json(nullptr) : json("minmax")}, {"observer_kwargs", json::object()}};
}

// llm-compressor's FP8 recipes: FP8_DYNAMIC (channel weights, dynamic per-token
// activations), FP8 (tensor weights, static per-tensor activations), and
// weight-only (input_activations null).
json compressed_tensors(const std::string& weight_strategy, const std::string& input_strategy, bool input_dynamic,
                        json ignore = {"lm_head"}, bool with_inputs = true) {
  json group = {{"targets", {"Linear"}},
                {"weights", float8_args(weight_strategy, false)},
                {"input_activations", with_inputs ? float8_args(input_strategy, input_dynamic) : json(nullptr)},
                {"output_activations", nullptr},
                {"format", "float-quantized"}};
  return {{"quant_method", "compressed-tensors"},
          {"format", "float-quantized"},
          {"quantization_status", "compressed"},
          {"global_compression_ratio", 1.5},
          {"config_groups", {{"group_0", group}}},
          {"ignore", ignore},
          {"kv_cache_scheme", nullptr},
          {"sparsity_config", json::object()},
          {"version", "0.9.1"}};
}

json fbgemm(json modules_to_not_convert = {"lm_head"}) {
  return {{"quant_method", "fbgemm_fp8"}, {"activation_scale_ub", 1200.0}, {"modules_to_not_convert", modules_to_not_convert}};
}

// ---- quantization_config parsing ----

TEST(Fp8ConfigTest, CompressedTensorsSchemesParse) {
  const QuantizationScheme dynamic = parse_quantization_config(compressed_tensors("channel", "token", true), kPath);
  EXPECT_EQ(dynamic.method, QuantizationMethod::kCompressedTensors);
  EXPECT_TRUE(dynamic.fp8());
  EXPECT_EQ(dynamic.weight_strategy, Fp8WeightStrategy::kChannel);
  EXPECT_EQ(dynamic.activations, Fp8Activations::kDynamicPerToken);
  EXPECT_FALSE(dynamic.static_input_scales());
  EXPECT_EQ(dynamic.ignore, std::vector<std::string>{"lm_head"});

  const QuantizationScheme static_scheme = parse_quantization_config(compressed_tensors("tensor", "tensor", false), kPath);
  EXPECT_EQ(static_scheme.weight_strategy, Fp8WeightStrategy::kTensor);
  EXPECT_EQ(static_scheme.activations, Fp8Activations::kStaticPerTensor);
  EXPECT_TRUE(static_scheme.static_input_scales());

  EXPECT_EQ(parse_quantization_config(compressed_tensors("tensor", "tensor", true), kPath).activations,
            Fp8Activations::kDynamicPerTensor);
  EXPECT_EQ(parse_quantization_config(compressed_tensors("channel", "", false, {}, false), kPath).activations,
            Fp8Activations::kNone);  // weight-only FP8
  json two_groups = compressed_tensors("channel", "token", true);  // several groups of one scheme
  two_groups["config_groups"]["group_1"] = two_groups["config_groups"]["group_0"];
  EXPECT_EQ(parse_quantization_config(two_groups, kPath).activations, Fp8Activations::kDynamicPerToken);
  json kv = compressed_tensors("channel", "token", true);
  kv["kv_cache_scheme"] = float8_args("tensor", false);  // llm-compressor's FP8 KV cache: k/v scales per layer
  EXPECT_TRUE(parse_quantization_config(kv, kPath).fp8());
  EXPECT_TRUE(parse_quantization_config(kv, kPath).kv_cache_scales);
  EXPECT_FALSE(dynamic.kv_cache_scales);  // "kv_cache_scheme": null
  EXPECT_EQ(describe(dynamic), "compressed-tensors fp8: weights per channel, activations dynamic per token, 1 ignore entry");
}

TEST(Fp8ConfigTest, FbgemmFp8Parses) {
  const QuantizationScheme scheme = parse_quantization_config(fbgemm({"lm_head", "model.layers.0.mlp"}), kPath);
  EXPECT_EQ(scheme.method, QuantizationMethod::kFbgemmFp8);
  EXPECT_EQ(scheme.weight_strategy, Fp8WeightStrategy::kChannel);
  EXPECT_EQ(scheme.activations, Fp8Activations::kDynamicPerToken);
  EXPECT_EQ(scheme.activation_scale_ub, 1200.0f);
  json no_list = fbgemm();
  no_list["modules_to_not_convert"] = nullptr;
  EXPECT_TRUE(parse_quantization_config(no_list, kPath).ignore.empty());
}

TEST(Fp8ConfigTest, IgnoreListsMatchAsTheirWritersDo) {
  QuantizationScheme compressed =
      parse_quantization_config(compressed_tensors("channel", "token", true,
                                                   {"lm_head", "re:.*mlp\\.down_proj", "re:model\\.layers\\.1\\.self_attn\\.q",
                                                    "re:layers"}),
                                kPath);
  EXPECT_TRUE(compressed.ignores("lm_head"));
  EXPECT_TRUE(compressed.ignores("model.layers.3.mlp.down_proj"));
  EXPECT_TRUE(compressed.ignores("model.layers.1.self_attn.q_proj"));  // matched from the start, like re.match
  EXPECT_FALSE(compressed.ignores("model.layers.0.self_attn.q_proj"));  // "re:layers" does not match mid-name
  EXPECT_FALSE(compressed.ignores("model.layers.0.mlp.up_proj"));
  const QuantizationScheme exact = parse_quantization_config(compressed_tensors("channel", "token", true, {"lm_head"}), kPath);
  EXPECT_FALSE(exact.ignores("model.lm_head"));  // names are exact
  const QuantizationScheme fb = parse_quantization_config(fbgemm({"model.layers.0.mlp"}), kPath);
  EXPECT_TRUE(fb.ignores("model.layers.0.mlp.down_proj"));  // transformers' rule: a part of the name
  EXPECT_FALSE(fb.ignores("model.layers.1.mlp.down_proj"));
  EXPECT_FALSE(QuantizationScheme{}.ignores("lm_head"));
}

// Each case: a change to a valid config, the error kind and what its message must name.
struct BadConfig {
  const char* what;
  std::function<void(json&)> change;
  ErrorKind kind;
  std::vector<std::string> needles;
};

TEST(Fp8ConfigTest, EveryUnsupportedOrMalformedSchemeIsRefusedByName) {
  const auto group = [](json& config) -> json& { return config["config_groups"]["group_0"]; };
  const std::vector<BadConfig> cases = {
      {"no method", [](json& c) { c.erase("quant_method"); }, ErrorKind::kFormat, {"quant_method"}},
      {"gptq", [](json& c) { c["quant_method"] = "gptq"; }, ErrorKind::kUnsupported, {"\"gptq\"", "not supported"}},
      {"fp8 method", [](json& c) { c["quant_method"] = "fp8"; }, ErrorKind::kUnsupported, {"\"fp8\""}},
      {"packed", [](json& c) { c["format"] = "pack-quantized"; }, ErrorKind::kUnsupported, {"pack-quantized"}},
      {"no format", [](json& c) { c.erase("format"); }, ErrorKind::kFormat, {"format"}},
      {"no groups", [](json& c) { c.erase("config_groups"); }, ErrorKind::kFormat, {"config_groups"}},
      {"empty groups", [](json& c) { c["config_groups"] = json::object(); }, ErrorKind::kFormat, {"config_groups"}},
      {"regex targets", [&](json& c) { group(c)["targets"] = {"re:.*q_proj"}; }, ErrorKind::kUnsupported,
       {"group_0.targets", "Linear"}},
      {"4 bits", [&](json& c) { group(c)["weights"]["num_bits"] = 4; }, ErrorKind::kUnsupported,
       {"weights.num_bits 4"}},
      {"int8", [&](json& c) { group(c)["weights"]["type"] = "int"; }, ErrorKind::kUnsupported,
       {"weights.type \"int\""}},
      {"group strategy", [&](json& c) { group(c)["weights"]["strategy"] = "group"; }, ErrorKind::kUnsupported,
       {"weights.strategy \"group\""}},
      {"block", [&](json& c) {
         group(c)["weights"]["strategy"] = "block";
         group(c)["weights"]["block_structure"] = {128, 128};
       }, ErrorKind::kUnsupported, {"block_structure"}},
      {"asymmetric weights", [&](json& c) { group(c)["weights"]["symmetric"] = false; }, ErrorKind::kUnsupported,
       {"weights.symmetric"}},
      {"dynamic weights", [&](json& c) { group(c)["weights"]["dynamic"] = true; }, ErrorKind::kUnsupported,
       {"weights.dynamic"}},
      {"no weights", [&](json& c) { group(c)["weights"] = nullptr; }, ErrorKind::kUnsupported, {"weights"}},
      {"static per token", [&](json& c) { group(c)["input_activations"]["dynamic"] = false; }, ErrorKind::kUnsupported,
       {"static per-token"}},
      {"16-bit inputs", [&](json& c) { group(c)["input_activations"]["num_bits"] = 16; }, ErrorKind::kUnsupported,
       {"input_activations.num_bits 16"}},
      {"input groups", [&](json& c) { group(c)["input_activations"]["strategy"] = "group"; }, ErrorKind::kUnsupported,
       {"input_activations.strategy \"group\""}},
      {"asymmetric static inputs", [&](json& c) {
         group(c)["input_activations"] = float8_args("tensor", false);
         group(c)["input_activations"]["symmetric"] = false;
       }, ErrorKind::kUnsupported, {"input_activations.symmetric"}},
      {"output activations", [&](json& c) { group(c)["output_activations"] = float8_args("tensor", true); },
       ErrorKind::kUnsupported, {"output_activations"}},
      {"mixed groups", [&](json& c) {
         c["config_groups"]["group_1"] = group(c);
         c["config_groups"]["group_1"]["weights"]["strategy"] = "tensor";
       }, ErrorKind::kUnsupported, {"different schemes"}},
      {"bad regex", [](json& c) { c["ignore"] = {"re:(unclosed"}; }, ErrorKind::kFormat, {"re:(unclosed"}},
      {"ignore not a list", [](json& c) { c["ignore"] = "lm_head"; }, ErrorKind::kFormat, {"ignore"}},
      {"bits as text", [&](json& c) { group(c)["weights"]["num_bits"] = "8"; }, ErrorKind::kFormat, {"num_bits"}},
      {"sparsity", [](json& c) { c["sparsity_config"] = {{"format", "sparse-24-bitmask"}}; }, ErrorKind::kUnsupported,
       {"sparsity_config"}},
      {"kv scales per head", [](json& c) { c["kv_cache_scheme"] = float8_args("attn_head", false); },
       ErrorKind::kUnsupported, {"kv_cache_scheme.strategy \"attn_head\"", "per tensor"}},
      {"dynamic kv scales", [](json& c) { c["kv_cache_scheme"] = float8_args("tensor", true); },
       ErrorKind::kUnsupported, {"kv_cache_scheme.dynamic"}},
      {"int8 kv cache", [](json& c) {
         c["kv_cache_scheme"] = float8_args("tensor", false);
         c["kv_cache_scheme"]["type"] = "int";
       }, ErrorKind::kUnsupported, {"kv_cache_scheme.type"}},
  };
  for (const BadConfig& bad : cases) {
    SCOPED_TRACE(bad.what);
    json config = compressed_tensors("channel", "token", true);
    bad.change(config);
    try {
      parse_quantization_config(config, kPath);
      ADD_FAILURE() << "accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), bad.kind) << error.what();
      EXPECT_NE(std::string(error.what()).find(kPath), std::string::npos) << error.what();
      for (const std::string& needle : bad.needles)
        EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what() << " lacks " << needle;
    }
  }
  for (const json& bound : {json(nullptr), json(-1.0), json("1200"), json(0.0)}) {
    json config = fbgemm();
    config["activation_scale_ub"] = bound;
    expect_error([&] { parse_quantization_config(config, kPath); }, ErrorKind::kFormat, {"activation_scale_ub"});
  }
  expect_error([&] { parse_quantization_config(json::array(), kPath); }, ErrorKind::kFormat, {"quantization_config"});
}

TEST(Fp8ConfigTest, ConfigJsonCarriesTheScheme) {
  const ModelConfig plain = test::tiny_config(Architecture::kLlama);
  json config_json = hf_config_to_json(plain);
  EXPECT_FALSE(parse_hf_config(config_json, kPath).quantization.fp8());
  config_json["quantization_config"] = compressed_tensors("tensor", "tensor", false);
  const ModelConfig quantized = parse_hf_config(config_json, kPath);
  EXPECT_EQ(quantized.quantization.weight_strategy, Fp8WeightStrategy::kTensor);
  EXPECT_EQ(quantized.quantization.activations, Fp8Activations::kStaticPerTensor);
  config_json["quantization_config"] = {{"quant_method", "awq"}, {"bits", 4}};
  expect_error([&] { parse_hf_config(config_json, kPath); }, ErrorKind::kUnsupported, {kPath, "\"awq\""});
  config_json["quantization_config"] = "fp8";
  expect_error([&] { parse_hf_config(config_json, kPath); }, ErrorKind::kFormat, {"quantization_config"});
}

// ---- quantizing a model here, as llm-compressor would ----

struct QuantizeOptions {
  QuantizationScheme scheme;
  StoredDtype scale_dtype = StoredDtype::kF32;
  bool scale_shape_one = false;  // per-tensor scales as [1] instead of []
};

const char* const kLinears[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

// Stored precision of a scale (what the reader gives back).
float stored(float value, StoredDtype dtype) {
  return dtype == StoredDtype::kBF16 ? bf16_to_float(float_to_bf16(value)) : value;
}

// Replaces every linear weight the scheme quantizes by e4m3 rows with
// weight_scale (and, static, input_scale) tensors. `expected` gets the
// dequantized fp32 weights (e4m3 x the stored scale), the weights the CPU must run.
TensorMap quantize_checkpoint(const ModelConfig& config, const TensorMap& source, const QuantizeOptions& options,
                              TensorMap& expected, std::map<std::string, StoredDtype>& dtypes) {
  TensorMap out = source;
  expected = source;
  for (int layer = 0; layer < config.num_layers; ++layer)
    for (const char* linear : kLinears) {
      const std::string module = "model.layers." + std::to_string(layer) + "." + linear;
      if (options.scheme.ignores(module)) continue;
      const Tensor& weight = source.at(module + ".weight");
      const int64_t rows = weight.shape[0];
      Fp8Linear fp8 = quantize_fp8_linear(weight, options.scheme.weight_strategy == Fp8WeightStrategy::kChannel,
                                          [&](float scale) { return stored(scale, options.scale_dtype); });
      const std::vector<float>& scales = fp8.scales;
      out[module + ".weight"] = fp8.rows;
      expected[module + ".weight"] = Tensor::from_vector(weight.shape, std::move(fp8.dequantized));
      if (options.scheme.weight_strategy == Fp8WeightStrategy::kChannel)
        out[module + ".weight_scale"] = Tensor::from_vector({rows, 1}, scales);
      else
        out[module + ".weight_scale"] =
            options.scale_shape_one ? Tensor::from_vector({1}, {scales[0]}) : Tensor::scalar(scales[0]);
      dtypes[module + ".weight_scale"] = options.scale_dtype;
      if (options.scheme.static_input_scales())
        out[module + ".input_scale"] = Tensor::scalar(0.01f * static_cast<float>(layer + 1));
    }
  return out;
}

// A tiny synthetic llama written by make-model's code, and its FP8 twin in another directory.
struct Checkpoints {
  TempDir source;
  TempDir fp8;
  TensorMap expected;  // the FP8 checkpoint's weights dequantized, fp32
  LoadedModel original;
};

void write_fp8_twin(Checkpoints& checkpoints, const json& quantization_config, const QuantizeOptions& options) {
  namespace fs = std::filesystem;
  write_synthetic_model(checkpoints.source.str(), SyntheticModelOptions{});
  checkpoints.original = load_model(checkpoints.source.str());
  const ModelConfig& config = checkpoints.original.config;
  std::map<std::string, StoredDtype> dtypes;
  const TensorMap fp8 = quantize_checkpoint(config, read_safetensors_checkpoint(checkpoints.source.str()), options,
                                            checkpoints.expected, dtypes);
  write_safetensors((checkpoints.fp8.path() / "model.safetensors").string(), fp8, StoredDtype::kF32, {}, dtypes);
  json config_json = json::parse(test::read_file_bytes(checkpoints.source.path() / "config.json"));
  config_json["quantization_config"] = quantization_config;
  std::ofstream(checkpoints.fp8.path() / "config.json") << config_json.dump(2);
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(checkpoints.source.path() / file, checkpoints.fp8.path() / file);
}

std::vector<float> prefill_logits(Backend& backend, const std::vector<int32_t>& tokens) {
  backend.allocate_kv_cache({16, 4});
  test::SequenceInput input;
  input.tokens = tokens;
  input.block_ids = {3, 0, 9, 4, 7};
  input.logits_for_all_tokens = true;
  return backend.forward(test::make_batch({input})).logits;
}

double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) worst = std::max(worst, std::abs(double(a[i]) - b[i]));
  return worst;
}

// Loads the FP8 twin, checks its weights and runs it on the CPU against the
// fp32 model of its dequantized weights (and, to show the comparison is not
// vacuous, against the unquantized original).
void check_checkpoint_runs_as_dequantized(const json& quantization_config, const QuantizeOptions& options,
                                          const std::vector<std::string>& ignored_modules = {}) {
  Checkpoints checkpoints;
  write_fp8_twin(checkpoints, quantization_config, options);
  const std::vector<int32_t> tokens = test::random_tokens(5, 17, checkpoints.original.config.vocab_size);
  for (const bool keep_quantized : {false, true}) {
    SCOPED_TRACE(keep_quantized ? "keep_quantized" : "fp32 load");
    const LoadedModel model = load_model(checkpoints.fp8.str(), {.keep_quantized = keep_quantized});
    ASSERT_TRUE(model.config.quantization.fp8());
    EXPECT_EQ(model.config.quantization.method, options.scheme.method);
    EXPECT_TRUE(has_fp8_weights(*model.weights));
    // The representation: e4m3 rows in the mapping, per-row scales, the static input scale.
    for (int layer = 0; layer < model.config.num_layers; ++layer) {
      const LayerWeights& weights = model.weights->layers[layer];
      for (const auto& [name, tensor] : {std::pair{"self_attn.q_proj", &weights.q_proj}, std::pair{"mlp.down_proj", &weights.down_proj}}) {
        const std::string module = "model.layers." + std::to_string(layer) + "." + name;
        const bool ignored = std::find(ignored_modules.begin(), ignored_modules.end(), module) != ignored_modules.end();
        EXPECT_EQ(tensor->is_fp8(), !ignored) << module;
        if (ignored) continue;
        ASSERT_NE(tensor->quantized.fp8.rows, nullptr);
        const Tensor& expected = checkpoints.expected.at(module + ".weight");
        const int64_t columns = tensor->shape[1];
        for (int64_t r = 0; r < tensor->shape[0]; r += 5)
          EXPECT_EQ(e4m3_to_float(tensor->quantized.bytes[r * columns + 1]) * tensor->quantized.fp8.rows[r],
                    expected.data[r * columns + 1]) << module << " row " << r;
        EXPECT_EQ(tensor->quantized.fp8.input,
                  options.scheme.static_input_scales() ? 0.01f * static_cast<float>(layer + 1) : 0.0f);
      }
    }
    ModelConfig plain_config = model.config;
    plain_config.quantization = {};
    const auto reference_weights = std::make_shared<const ModelWeights>(
        build_model_weights(plain_config, checkpoints.expected, "expected"));
    auto fp8_backend = make_cpu_backend(model.config, model.weights, {.num_threads = 2});
    auto reference = make_cpu_backend(plain_config, reference_weights, {.num_threads = 2});
    auto original = make_cpu_backend(checkpoints.original.config, checkpoints.original.weights, {.num_threads = 2});
    const std::vector<float> fp8_logits = prefill_logits(*fp8_backend, tokens);
    const std::vector<float> expected_logits = prefill_logits(*reference, tokens);
    EXPECT_LE(max_abs_difference(fp8_logits, expected_logits), 1e-5);
    EXPECT_GT(max_abs_difference(fp8_logits, prefill_logits(*original, tokens)), 1e-4);  // quantization shows
    // Tensor parallelism: shards cut from the dequantized weights give the same logits.
    auto sharded = make_cpu_backend(model.config, model.weights, {.num_threads = 2, .tensor_parallel_size = 2});
    EXPECT_LE(max_abs_difference(prefill_logits(*sharded, tokens), expected_logits), 1e-4);
  }
}

TEST(Fp8CheckpointTest, CompressedTensorsDynamicPerChannelRunsAsItsDequantizedWeights) {
  QuantizeOptions options;
  options.scheme = parse_quantization_config(compressed_tensors("channel", "token", true), kPath);
  check_checkpoint_runs_as_dequantized(compressed_tensors("channel", "token", true), options);
}

TEST(Fp8CheckpointTest, CompressedTensorsStaticPerTensorWithBf16ScalesAndIgnoredModules) {
  const json config = compressed_tensors("tensor", "tensor", false, {"lm_head", "re:.*layers\\.1\\.mlp\\.down_proj"});
  QuantizeOptions options;
  options.scheme = parse_quantization_config(config, kPath);
  options.scale_dtype = StoredDtype::kBF16;
  options.scale_shape_one = true;
  check_checkpoint_runs_as_dequantized(config, options, {"model.layers.1.mlp.down_proj"});
}

TEST(Fp8CheckpointTest, FbgemmFp8RunsAsItsDequantizedWeights) {
  const json config = fbgemm({"lm_head", "model.layers.0.self_attn.q_proj"});
  QuantizeOptions options;
  options.scheme = parse_quantization_config(config, kPath);
  check_checkpoint_runs_as_dequantized(config, options, {"model.layers.0.self_attn.q_proj"});
}

// ---- the weights' scales, in memory ----

struct InMemory {
  ModelConfig config;
  TensorMap tensors;
};

// The tiny reference llama quantized as `scheme` (per-tensor scales as []).
InMemory quantized_in_memory(const json& quantization_config, bool tied = true) {
  InMemory model;
  model.config = test::tiny_config(Architecture::kLlama);
  model.config.tie_word_embeddings = tied;
  model.config.quantization = parse_quantization_config(quantization_config, kPath);
  const auto weights = test::random_weights(model.config, 21);
  ModelConfig plain = model.config;
  plain.quantization = {};
  TensorMap expected;
  std::map<std::string, StoredDtype> dtypes;
  model.tensors = quantize_checkpoint(model.config, model_weights_to_tensor_map(plain, *weights),
                                      {model.config.quantization}, expected, dtypes);
  return model;
}

TEST(Fp8CheckpointTest, ScalesAreCheckedAgainstTheScheme) {
  const std::string q = "model.layers.0.self_attn.q_proj";
  const std::string down = "model.layers.1.mlp.down_proj";
  auto build = [](const InMemory& model) { return build_model_weights(model.config, model.tensors, "ckpt"); };
  {  // per channel: [out, 1], finite and > 0
    const InMemory valid = quantized_in_memory(compressed_tensors("channel", "token", true));
    EXPECT_TRUE(build(valid).layers[0].q_proj.is_fp8());
    InMemory model = valid;
    model.tensors.erase(q + ".weight_scale");
    expect_error([&] { build(model); }, ErrorKind::kNotFound, {"ckpt", q + ".weight_scale", "[64, 1]"});
    model = valid;
    model.tensors[q + ".weight_scale"] = Tensor::from_vector({64}, std::vector<float>(64, 1.0f));
    expect_error([&] { build(model); }, ErrorKind::kFormat, {q + ".weight_scale", "shape [64]", "[64, 1]"});
    model.tensors[q + ".weight_scale"] = Tensor::scalar(1.0f);
    expect_error([&] { build(model); }, ErrorKind::kFormat, {q + ".weight_scale", "shape []", "per channel"});
    for (const float bad : {0.0f, -0.5f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      std::vector<float> scales(64, 0.01f);
      scales[17] = bad;
      model.tensors[q + ".weight_scale"] = Tensor::from_vector({64, 1}, scales);
      expect_error([&] { build(model); }, ErrorKind::kFormat, {q + ".weight_scale", "index 17", "finite and > 0"});
    }
    model = valid;  // a scale stored as e4m3 itself
    auto byte = std::make_shared<std::vector<uint8_t>>(64, 0x38);
    Tensor fp8_scale;
    fp8_scale.shape = {64, 1};
    fp8_scale.quantized = {kF8E4M3RowType, byte->data(), 1};
    fp8_scale.storage = byte;
    model.tensors[q + ".weight_scale"] = fp8_scale;
    expect_error([&] { build(model); }, ErrorKind::kFormat, {q + ".weight_scale", "F8_E4M3"});
    // The weight's own dtype against the config.
    model = valid;
    model.tensors[down + ".weight"] = to_fp32(valid.tensors.at(down + ".weight"));
    expect_error([&] { build(model); }, ErrorKind::kFormat, {down + ".weight", "expected F8_E4M3", "ignore"});
    ModelConfig no_scheme = valid.config;
    no_scheme.quantization = {};
    expect_error([&] { build_model_weights(no_scheme, valid.tensors, "ckpt"); }, ErrorKind::kFormat,
                 {"F8_E4M3", "no quantization_config"});
    model = valid;
    model.config.quantization.ignore.push_back(q);  // listed as unquantized, stored FP8
    expect_error([&] { build(model); }, ErrorKind::kFormat, {q + ".weight", "F8_E4M3", "ignore"});
  }
  {  // per tensor: [] or [1]; static activations need input_scale, also [] or [1], > 0
    const InMemory valid = quantized_in_memory(compressed_tensors("tensor", "tensor", false));
    const ModelWeights weights = build(valid);
    const Tensor& k = weights.layers[1].k_proj;
    ASSERT_TRUE(k.is_fp8());
    const float scale = valid.tensors.at("model.layers.1.self_attn.k_proj.weight_scale").data[0];
    for (int64_t r = 0; r < k.shape[0]; ++r) EXPECT_EQ(k.quantized.fp8.rows[r], scale);  // expanded to every row
    EXPECT_EQ(k.quantized.fp8.input, 0.02f);
    InMemory model = valid;
    model.tensors[q + ".weight_scale"] = Tensor::from_vector({1}, {0.5f});
    EXPECT_EQ(build(model).layers[0].q_proj.quantized.fp8.rows[63], 0.5f);
    model.tensors[q + ".weight_scale"] = Tensor::from_vector({2}, {0.5f, 0.5f});
    expect_error([&] { build(model); }, ErrorKind::kFormat, {q + ".weight_scale", "shape [2]", "[] or [1]"});
    model = valid;
    model.tensors.erase(down + ".input_scale");
    expect_error([&] { build(model); }, ErrorKind::kNotFound, {down + ".input_scale", "static"});
    model.tensors[down + ".input_scale"] = Tensor::scalar(-1.0f);
    expect_error([&] { build(model); }, ErrorKind::kFormat, {down + ".input_scale", "finite and > 0"});
    model.tensors[down + ".input_scale"] = Tensor::from_vector({1, 1}, {1.0f});
    expect_error([&] { build(model); }, ErrorKind::kFormat, {down + ".input_scale", "shape [1, 1]"});
  }
  {  // the embedding and lm_head stay 16/32-bit
    InMemory model = quantized_in_memory(fbgemm(), /*tied=*/false);
    model.tensors["lm_head.weight"] = model.tensors.at("model.layers.0.self_attn.q_proj.weight");
    model.tensors["lm_head.weight"].shape = {97, 64};
    auto bytes = std::make_shared<std::vector<uint8_t>>(97 * 64, 0x38);
    model.tensors["lm_head.weight"].quantized.bytes = bytes->data();
    model.tensors["lm_head.weight"].storage = bytes;
    expect_error([&] { build(model); }, ErrorKind::kUnsupported, {"lm_head.weight", "F8_E4M3"});
  }
}

// FP8 rows are cut for tensor parallelism in place, scales following their rows.
TEST(Fp8CheckpointTest, ShardsSliceE4M3RowsAndTheirScales) {
  const InMemory model = quantized_in_memory(compressed_tensors("channel", "token", true));
  const ModelWeights weights = build_model_weights(model.config, model.tensors, "ckpt");
  const ModelWeights dequantized = dequantize_fp8_weights(weights);
  EXPECT_FALSE(has_fp8_weights(dequantized));
  for (int32_t rank = 0; rank < 2; ++rank) {
    const TensorParallelShard shard = tensor_parallel_shard(model.config, rank, 2);
    const ModelWeights part = shard_model_weights(model.config, weights, shard);
    const ModelWeights expected = shard_model_weights(model.config, dequantized, shard);
    for (size_t l = 0; l < part.layers.size(); ++l)
      for (const auto& [got, want] : {std::pair{&part.layers[l].q_proj, &expected.layers[l].q_proj},
                                      std::pair{&part.layers[l].o_proj, &expected.layers[l].o_proj},
                                      std::pair{&part.layers[l].down_proj, &expected.layers[l].down_proj}}) {
        ASSERT_TRUE(got->is_fp8());
        ASSERT_EQ(got->shape, want->shape);
        const Tensor values = to_fp32(*got);
        for (int64_t i = 0; i < want->numel(); ++i) ASSERT_EQ(values.data[i], want->data[i]) << "layer " << l << " " << i;
      }
    EXPECT_EQ(part.layers[0].o_proj.quantized.row_bytes, model.config.q_size());  // a view keeping the stride
  }
}

// The KV identity of an FP8 checkpoint covers its scales: the same e4m3 bytes with other scales are another model.
TEST(Fp8CheckpointTest, TheModelFingerprintCoversTheScales) {
  const InMemory model = quantized_in_memory(compressed_tensors("tensor", "tensor", false));
  const ModelWeights weights = build_model_weights(model.config, model.tensors, "ckpt");
  InMemory rescaled = model;
  rescaled.tensors["model.layers.1.mlp.up_proj.weight_scale"] = Tensor::scalar(0.125f);
  InMemory other_input = model;
  other_input.tensors["model.layers.0.self_attn.v_proj.input_scale"] = Tensor::scalar(0.5f);
  const KvBlockHash base = model_fingerprint(model.config, weights);
  EXPECT_EQ(base, model_fingerprint(model.config, build_model_weights(model.config, model.tensors, "again")));
  EXPECT_NE(base, model_fingerprint(model.config, build_model_weights(model.config, rescaled.tensors, "ckpt")));
  EXPECT_NE(base, model_fingerprint(model.config, build_model_weights(model.config, other_input.tensors, "ckpt")));
}

// compressed-tensors' kv_cache_scheme: every layer's self_attn.k_scale and
// v_scale (or the older k_proj/v_proj.output_scale) become LayerWeights'
// KV cache scales, checked as the other scales are, and enter the fingerprint.
TEST(Fp8CheckpointTest, KvCacheScalesAreReadCheckedAndFingerprinted) {
  json config = compressed_tensors("channel", "token", true);
  config["kv_cache_scheme"] = float8_args("tensor", false);
  InMemory model = quantized_in_memory(config);
  auto build = [](const InMemory& m) { return build_model_weights(m.config, m.tensors, "ckpt"); };
  const std::string attention0 = "model.layers.0.self_attn.", attention1 = "model.layers.1.self_attn.";
  expect_error([&] { build(model); }, ErrorKind::kNotFound, {"ckpt", attention0 + "k_scale", "kv_cache_scheme"});
  model.tensors[attention0 + "k_scale"] = Tensor::scalar(0.02f);
  model.tensors[attention0 + "v_scale"] = Tensor::from_vector({1}, {0.04f});
  model.tensors[attention1 + "k_proj.output_scale"] = Tensor::scalar(0.5f);  // the older names
  model.tensors[attention1 + "v_proj.output_scale"] = Tensor::scalar(0.25f);
  const ModelWeights weights = build(model);
  EXPECT_EQ(weights.layers[0].k_cache_scale, 0.02f);
  EXPECT_EQ(weights.layers[0].v_cache_scale, 0.04f);
  EXPECT_EQ(weights.layers[1].k_cache_scale, 0.5f);
  EXPECT_EQ(weights.layers[1].v_cache_scale, 0.25f);
  InMemory bad = model;
  bad.tensors[attention1 + "v_proj.output_scale"] = Tensor::scalar(-1.0f);
  expect_error([&] { build(bad); }, ErrorKind::kFormat, {attention1 + "v_proj.output_scale", "finite and > 0"});
  bad = model;
  bad.tensors[attention0 + "k_scale"] = Tensor::from_vector({2}, {0.1f, 0.2f});  // per head: not read
  expect_error([&] { build(bad); }, ErrorKind::kFormat, {attention0 + "k_scale", "shape [2]"});
  InMemory rescaled = model;
  rescaled.tensors[attention0 + "v_scale"] = Tensor::scalar(0.08f);
  EXPECT_NE(model_fingerprint(model.config, weights), model_fingerprint(model.config, build(rescaled)));
  // Without the scheme the tensors are not read (a bf16 cache has no use for them).
  InMemory plain = quantized_in_memory(compressed_tensors("channel", "token", true));
  plain.tensors[attention0 + "k_scale"] = Tensor::scalar(0.02f);
  EXPECT_EQ(build(plain).layers[0].k_cache_scale, 0.0f);
  // Tensor-parallel ranks keep every layer's scales.
  const ModelWeights rank = shard_model_weights(model.config, weights, tensor_parallel_shard(model.config, 1, 2));
  EXPECT_EQ(rank.layers[1].v_cache_scale, 0.25f);
}

// ---- backends ----

TEST(Fp8CheckpointTest, BackendsDeclareWhatTheyRunAndFp8CheckpointsNeedIt) {
  const InMemory model = quantized_in_memory(compressed_tensors("channel", "token", true));
  auto cpu = make_cpu_backend(model.config,
                              std::make_shared<const ModelWeights>(build_model_weights(model.config, model.tensors, "ckpt")));
  const BackendCapabilities capabilities = cpu->capabilities();
  EXPECT_FALSE(capabilities.fp8_weights);
  EXPECT_FALSE(capabilities.fp8_kv_cache);
  EXPECT_TRUE(capabilities.dequantizes_fp8_weights);
  EXPECT_NO_THROW(check_model_capabilities(capabilities, model.config));
  BackendCapabilities neither = capabilities;
  neither.name = "gpu";
  neither.dequantizes_fp8_weights = false;
  expect_error([&] { check_model_capabilities(neither, model.config); }, ErrorKind::kUnsupported,
               {"FP8 weights", "compressed-tensors", "gpu backend"});
  BackendCapabilities native = neither;
  native.fp8_weights = true;
  EXPECT_NO_THROW(check_model_capabilities(native, model.config));
  ModelConfig plain = model.config;
  plain.quantization = {};
  EXPECT_NO_THROW(check_model_capabilities(neither, plain));
}

}  // namespace
}  // namespace loom
