// ModelConfig from a GGUF file's metadata (formats/gguf.h reads the container).
#pragma once

#include "formats/gguf.h"
#include "model/config.h"

namespace loom {

// Hyper-parameters from `llama.*` metadata (llama and mistral-like files).
ModelConfig gguf_model_config(const GgufFile& gguf);

}  // namespace loom
