// config.json <-> ModelConfig for the Hugging Face architectures we serve.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "model/config.h"

namespace loom {

// Parses config.json. Throws Error(kUnsupported) for an unknown architecture,
// rope_scaling type or quantization_config (model/quantization.h: FP8 from
// compressed-tensors and fbgemm_fp8 only), Error(kFormat) naming `path` for
// missing or ill-typed fields.
ModelConfig parse_hf_config(const nlohmann::json& json, const std::string& path);
ModelConfig read_hf_config(const std::string& path);

// Writes a config.json that transformers 5 loads as the same model (without a
// quantization_config: writers store fp32/16-bit weights).
nlohmann::json hf_config_to_json(const ModelConfig& config);

}  // namespace loom
