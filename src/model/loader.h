// One entry point for every model format users hand to `--model`.
#pragma once

#include <memory>
#include <string>

#include "model/config.h"
#include "model/weights.h"

namespace loom {

class Tokenizer;

struct LoadedModel {
  std::string path;     // directory or .gguf file as given
  ModelConfig config;
  std::shared_ptr<const ModelWeights> weights;
  std::shared_ptr<const Tokenizer> tokenizer;  // tokenizer.json(+tokenizer_config.json) or GGUF vocab
};

// `path` is a Hugging Face directory (config.json + safetensors + tokenizer.json)
// or a .gguf file. Throws loom::Error naming the file and tensor on any problem.
LoadedModel load_model(const std::string& path);

}  // namespace loom
