// Random models for tests and benchmarks (`loom make-model`).
//
// write_synthetic_model(DIR, options) writes a Hugging Face directory that
// transformers 5 and Loom both load:
//
//   DIR/config.json              hf_config_to_json(synthetic_model_config(...))
//   DIR/model.safetensors        f32 (tiny) or bf16 (8b), streamed to disk
//   DIR/tokenizer.json           synthetic byte-level BPE of the arch's family
//   DIR/tokenizer_config.json
//   DIR/adapters/adapterI/       adapter_config.json + adapter_model.safetensors
//
// `loom make-model` flags map onto SyntheticModelOptions:
//   --arch llama|qwen2|qwen3|mistral  -> arch (architecture_from_short_name)
//   --preset tiny|8b                  -> preset (synthetic_preset_from_name)
//   --adapters N                      -> num_adapters (default 0)
//   --rank R                          -> rank (default 8)
//   --alpha A                         -> alpha (default 16)
//   --targets q_proj,v_proj,...       -> targets (default: the variety below)
//   --rslora                          -> use_rslora
//   --alora                           -> alora_invocation
//   --seed S                          -> seed (default 0)
//   --out DIR                         -> the directory argument
//
// Determinism: the output is byte-identical for the same options on every
// machine. Each tensor draws from its own util/prng.h stream, seeded by the
// seed and the tensor's name; values are computed with single roundings only
// (no a*b+c that FMA contraction could change).
//
// Scale: linear weights are uniform(-1, 1) * gain / sqrt(fan_in), norms
// (1 +- 1/8) * gain, embeddings uniform / sqrt(hidden), lm_head 4x that. The
// gains (synthetic/synthetic_weights.h) sharpen attention (q, k x3), let the layers
// dominate the residual stream (o, down x4) and give logits a std of about 2,
// so that greedy decoding depends on the context instead of repeating a token.
// LoRA A is uniform / sqrt(fan_in) and B uniform * gain / (scale * sqrt(rank)),
// so every adapted module moves its output by roughly half the base output:
// adapter logits differ visibly from the base model's and stay finite.
//
// Adapter variety (targets empty), adapter i follows recipe i % 4:
//   0: all seven projections, rank R, alpha A
//   1: q_proj, v_proj only, rank R/2 (2 when R < 2)
//   2: rsLoRA on q,k,o,up,down with rank_pattern {"o_proj": 2R,
//      "layers.0.mlp.down_proj": R/2} and alpha_pattern {"k_proj": 2A, "up_proj": A/2}
//   3: target_modules as a regex: k_proj, o_proj, gate_proj, up_proj of the even layers
// --targets replaces the recipes: every adapter targets that list with rank R.
// --rslora turns rsLoRA on for every adapter. --alora sets
// alora_invocation_tokens (synthetic_alora_invocation_tokens) on every adapter.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/safetensors.h"
#include "lora/adapter.h"
#include "model/config.h"

namespace loom {

// tiny: the tests' models (f32); 8b and 70b: Llama-3-8B and Llama-3-70B shapes, 14b: Qwen3-14B's
// (bf16), for benchmarks.
enum class SyntheticPreset { kTiny, k8b, k70b, k14b };

// "tiny" | "8b" | "14b" | "70b"; throws Error(kInvalidArgument) otherwise.
SyntheticPreset synthetic_preset_from_name(const std::string& name);
const char* synthetic_preset_name(SyntheticPreset preset);

struct SyntheticModelOptions {
  Architecture arch = Architecture::kLlama;
  SyntheticPreset preset = SyntheticPreset::kTiny;
  int num_adapters = 0;
  int rank = 8;
  float alpha = 16.0f;
  std::vector<std::string> targets;  // module names; empty: the recipes above
  bool use_rslora = false;
  bool alora_invocation = false;
  uint64_t seed = 0;
};

// The model's dimensions.
//   tiny: vocab 512; llama hidden 64, 2 layers, 4 heads / 2 kv, tied, rope theta
//         500000 + llama3 scaling; qwen2 hidden 96, 3 layers, 6 / 2, q/k/v biases;
//         qwen3 hidden 64, 2 layers, 4 / 2, head_dim 32, q/k norms, tied;
//         mistral hidden 64, 2 layers, 4 / 1, untied.
//   8b:   Llama-3-8B (hidden 4096, 32 layers, 32 / 8 heads, intermediate 14336,
//         vocab 128256, theta 500000, llama3 scaling), bf16, untied; other
//         archs keep these dimensions and add their own features.
// bos / eos ids are those of the synthetic tokenizer (llama3 family for llama,
// qwen2 for qwen2/qwen3, smollm for mistral; its special tokens are the last
// ids of the vocabulary, see synthetic/synthetic_tokenizer.h).
ModelConfig synthetic_model_config(Architecture arch, SyntheticPreset preset);

// The invocation sequence written into aLoRA adapters: two ordinary
// (non-special) tokens from the middle of the vocabulary.
std::vector<int> synthetic_alora_invocation_tokens(const ModelConfig& config);

struct SyntheticAdapterSpec {
  std::string name;  // "adapter0", "adapter1", ...
  LoraConfig config;
};

// The adapters write_synthetic_model writes. Throws Error(kInvalidArgument)
// for a rank < 1, a negative count or an unknown target name.
std::vector<SyntheticAdapterSpec> synthetic_adapter_specs(const SyntheticModelOptions& options,
                                                          const ModelConfig& config);

// The adapter's weights (A, B for every module the spec targets), deterministic
// in (seed, adapter name, tensor name).
LoraAdapter make_synthetic_adapter(const SyntheticAdapterSpec& spec, const ModelConfig& config, uint64_t seed);

// Writes the whole directory (created if needed; existing files are
// overwritten). Never holds more than one adapter and one chunk of the base
// weights in memory, so the 8b preset (16 GB on disk) fits in a few hundred MB.
// Throws Error(kInvalidArgument) for bad options or an unwritable directory.
void write_synthetic_model(const std::string& directory, const SyntheticModelOptions& options);

// Writes config.json + model.safetensors only, for any config (tests and
// benchmarks with custom sizes), streaming like write_synthetic_model.
void write_synthetic_checkpoint(const std::string& directory, const ModelConfig& config, uint64_t seed,
                                StoredDtype dtype);

}  // namespace loom
