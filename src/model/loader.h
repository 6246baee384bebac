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

struct LoadOptions {
  // A GGUF's quantized (and f16/bf16) 2-D weights, and a safetensors
  // checkpoint's f16/bf16 ones, stay in their file format (Tensor::quantized)
  // instead of being expanded to fp32: for the CPU backend's quantized kernels
  // only (--cpu-precision auto). F32 tensors are read as always.
  bool keep_quantized = false;
};

// `path` is a Hugging Face directory (config.json + safetensors + tokenizer.json)
// or a .gguf file. Throws loom::Error naming the file and tensor on any problem.
LoadedModel load_model(const std::string& path, const LoadOptions& options = {});

}  // namespace loom
