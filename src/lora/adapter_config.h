// adapter_config.json <-> LoraConfig, with PEFT 0.21's defaults and checks.
//
// Parsing keeps what changes the math (r, lora_alpha, use_rslora, targets,
// patterns, layer selection, aLoRA invocation tokens) and rejects, with
// Error(kUnsupported) and a hint, every option Loom does not serve. Options
// that only matter for training (lora_dropout, init_lora_weights, loftq,
// eva, corda, ...) are ignored.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "lora/adapter.h"

namespace loom {

// Parses the JSON of adapter_config.json. `json` must be an ordered_json so
// that rank_pattern / alpha_pattern keep their file order (PEFT takes the first
// matching key). Defaults as PEFT: target_modules null -> ["q_proj", "v_proj"]
// (PEFT's mapping for llama, mistral, qwen2 and qwen3); "all-linear" -> the
// seven projections. Throws Error(kFormat) naming `path` and the field for a
// missing or ill-typed field, Error(kUnsupported) for unsupported options.
LoraConfig parse_lora_config(const nlohmann::ordered_json& json, const std::string& path);

// Reads `path` (an adapter_config.json). Throws Error(kNotFound) if absent,
// Error(kFormat) for malformed JSON, plus what parse_lora_config throws.
LoraConfig read_lora_config(const std::string& path);

// The adapter_config.json PEFT 0.21 writes for `config` (peft_type "LORA",
// task_type "CAUSAL_LM", every field PEFT saves, plus "loom_kv_sharing" when
// set, which PEFT ignores with a warning).
nlohmann::ordered_json lora_config_to_json(const LoraConfig& config);

}  // namespace loom
