// ModelConfig from GGUF metadata ("<arch>.*" keys, llama.cpp's names).
#include <algorithm>
#include <cmath>

#include "model/gguf_config.h"
#include "util/error.h"

namespace loom {

namespace {

int to_int(const GgufFile& gguf, const std::string& key, int64_t value) {
  if (value < INT32_MIN || value > INT32_MAX)
    fail(ErrorKind::kFormat, "{}: metadata {} = {} is out of range", gguf.path, key, value);
  return static_cast<int>(value);
}

int int_or(const GgufFile& gguf, const std::string& key, int fallback) {
  return gguf.has(key) ? to_int(gguf, key, gguf.get_int(key)) : fallback;
}

int require_int(const GgufFile& gguf, const std::string& key) {
  return to_int(gguf, key, gguf.get_int(key));
}

// llama.cpp stores Llama 3's rope scaling not as metadata but as the tensor
// rope_freqs.weight (one wavelength factor per rotary pair). Every Llama 3.x
// release uses low_freq_factor 1, high_freq_factor 4 and an original context of
// 8192, with factor = the largest entry; we accept the tensor when it equals
// what those parameters give, so the model runs with HF's llama3 RoPE.
RopeScaling llama3_scaling_from_rope_freqs(const GgufFile& gguf, const ModelConfig& config) {
  const Tensor& factors = gguf.tensors.at("rope_freqs.weight");
  const int64_t num_pairs = config.head_dim / 2;
  if (num_pairs <= 0 || factors.numel() != num_pairs)
    fail(ErrorKind::kFormat, "{}: tensor rope_freqs.weight has {} entries, expected head_dim / 2 = {}", gguf.path,
         factors.numel(), num_pairs);
  RopeScaling scaling;
  scaling.type = RopeScaling::Type::kLlama3;
  scaling.factor = *std::max_element(factors.data, factors.data + num_pairs);
  scaling.low_freq_factor = 1.0f;
  scaling.high_freq_factor = 4.0f;
  scaling.original_max_position_embeddings = 8192;
  const double low_freq_wavelength = scaling.original_max_position_embeddings / scaling.low_freq_factor;
  const double high_freq_wavelength = scaling.original_max_position_embeddings / scaling.high_freq_factor;
  for (int64_t i = 0; i < num_pairs; ++i) {
    const double frequency = std::pow(static_cast<double>(config.rope_theta), -2.0 * i / config.head_dim);
    const double wavelength = 2 * M_PI / frequency;
    double expected = 1.0;
    if (wavelength > low_freq_wavelength) {
      expected = scaling.factor;
    } else if (wavelength >= high_freq_wavelength) {
      const double smooth = (scaling.original_max_position_embeddings / wavelength - scaling.low_freq_factor) /
                            (scaling.high_freq_factor - scaling.low_freq_factor);
      expected = 1.0 / ((1 - smooth) / scaling.factor + smooth);
    }
    if (std::abs(factors.data[i] - expected) > 1e-3 * expected)
      throw Error(ErrorKind::kUnsupported,
                  fmt::format("{}: tensor rope_freqs.weight is not Llama 3 rope scaling (entry {} is {}, "
                              "expected {} for factor {})",
                              gguf.path, i, factors.data[i], expected, scaling.factor),
                  "only llama3-style RoPE factors (low 1, high 4, original context 8192) are supported");
  }
  return scaling;
}

}  // namespace

ModelConfig gguf_model_config(const GgufFile& gguf) {
  const std::string& path = gguf.path;
  const std::string arch = gguf.get_string("general.architecture");
  ModelConfig config;
  if (arch == "llama") {
    config.arch = Architecture::kLlama;
  } else if (arch == "qwen2") {
    config.arch = Architecture::kQwen2;
    config.qkv_bias = true;
  } else if (arch == "qwen3") {
    config.arch = Architecture::kQwen3;
    config.qk_norm = true;
  } else {
    fail(ErrorKind::kUnsupported, "{}: GGUF architecture \"{}\" is not supported", path, arch);
  }
  const std::string prefix = arch + ".";

  config.hidden_size = require_int(gguf, prefix + "embedding_length");
  config.intermediate_size = require_int(gguf, prefix + "feed_forward_length");
  config.num_layers = require_int(gguf, prefix + "block_count");
  config.num_heads = require_int(gguf, prefix + "attention.head_count");
  config.num_kv_heads = int_or(gguf, prefix + "attention.head_count_kv", config.num_heads);
  if (config.num_heads <= 0)
    fail(ErrorKind::kFormat, "{}: {}attention.head_count must be positive", path, prefix);
  config.head_dim = int_or(gguf, prefix + "attention.key_length", config.hidden_size / config.num_heads);
  const int rope_dims = int_or(gguf, prefix + "rope.dimension_count", config.head_dim);
  if (rope_dims != config.head_dim)
    fail(ErrorKind::kUnsupported, "{}: partial RoPE ({}rope.dimension_count {} of head_dim {})", path,
         prefix, rope_dims, config.head_dim);
  config.max_position_embeddings = int_or(gguf, prefix + "context_length", 2048);
  config.rms_norm_eps = static_cast<float>(gguf.get_float(prefix + "attention.layer_norm_rms_epsilon"));
  config.rope_theta =
      gguf.has(prefix + "rope.freq_base") ? static_cast<float>(gguf.get_float(prefix + "rope.freq_base")) : 10000.0f;
  const std::string scaling_key = prefix + "rope.scaling.type";
  if (gguf.has(scaling_key) && gguf.get_string(scaling_key) != "none")
    fail(ErrorKind::kUnsupported, "{}: {} \"{}\" is not supported", path, scaling_key,
         gguf.get_string(scaling_key));
  if (gguf.tensors.count("rope_freqs.weight") != 0)
    config.rope_scaling = llama3_scaling_from_rope_freqs(gguf, config);
  if (config.arch != Architecture::kQwen2) {
    config.qkv_bias = gguf.tensors.count("model.layers.0.self_attn.q_proj.bias") != 0;
    config.o_bias = gguf.tensors.count("model.layers.0.self_attn.o_proj.bias") != 0;
  }

  if (gguf.has("tokenizer.ggml.tokens")) {
    config.vocab_size = to_int(gguf, "tokenizer.ggml.tokens length",
                               static_cast<int64_t>(gguf.get_string_array("tokenizer.ggml.tokens").size()));
  } else if (gguf.has(prefix + "vocab_size")) {
    config.vocab_size = require_int(gguf, prefix + "vocab_size");
  } else if (auto embedding = gguf.tensors.find("model.embed_tokens.weight"); embedding != gguf.tensors.end()) {
    config.vocab_size = to_int(gguf, "model.embed_tokens.weight rows", embedding->second.shape.at(0));
  }
  // llama.cpp omits output.weight exactly when the embedding is tied.
  config.tie_word_embeddings = gguf.tensors.count("lm_head.weight") == 0;
  config.bos_token_id = int_or(gguf, "tokenizer.ggml.bos_token_id", -1);
  if (gguf.has("tokenizer.ggml.eos_token_id"))
    config.eos_token_ids.push_back(require_int(gguf, "tokenizer.ggml.eos_token_id"));
  config.torch_dtype = "float32";
  config.validate(path);
  return config;
}

}  // namespace loom
