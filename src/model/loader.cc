#include "model/loader.h"

#include <filesystem>

#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/gguf_config.h"
#include "model/hf_config.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace loom {

namespace {

LoadedModel load_hf_directory(const std::string& directory, const LoadOptions& options) {
  namespace fs = std::filesystem;
  const std::string config_path = (fs::path(directory) / "config.json").string();
  if (!fs::exists(config_path))
    throw Error(ErrorKind::kNotFound, fmt::format("{}: no config.json in the model directory", directory),
                "pass a Hugging Face model directory or a .gguf file");
  LoadedModel model;
  model.path = directory;
  model.config = read_hf_config(config_path);
  // FP8 weights stay e4m3 whatever the options: build_model_weights attaches their scales.
  TensorMap tensors = read_safetensors_checkpoint(directory, {.keep_16bit = options.keep_quantized, .keep_fp8 = true});
  model.weights = std::make_shared<const ModelWeights>(build_model_weights(model.config, tensors, directory));
  model.tokenizer = Tokenizer::from_hf_directory(directory);
  return model;
}

LoadedModel load_gguf(const std::string& path, const LoadOptions& options) {
  GgufFile gguf = read_gguf(path, {.keep_quantized = options.keep_quantized});
  LoadedModel model;
  model.path = path;
  model.config = gguf_model_config(gguf);
  model.weights = std::make_shared<const ModelWeights>(build_model_weights(model.config, gguf.tensors, path));
  model.tokenizer = Tokenizer::from_gguf(gguf);
  return model;
}

}  // namespace

LoadedModel load_model(const std::string& path, const LoadOptions& options) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (fs::is_directory(path, error)) return load_hf_directory(path, options);
  if (!fs::exists(path, error))
    throw Error(ErrorKind::kNotFound, fmt::format("model {} does not exist", path),
                "pass a Hugging Face model directory or a .gguf file");
  if (fs::path(path).extension() == ".gguf") return load_gguf(path, options);
  // Accept a GGUF with another extension too, by its magic.
  if (fs::is_regular_file(path, error) && fs::file_size(path, error) >= 4) {
    std::FILE* file = std::fopen(path.c_str(), "rb");
    char magic[4] = {};
    if (file != nullptr) {
      const size_t num_read = std::fread(magic, 1, 4, file);
      std::fclose(file);
      if (num_read == 4 && std::string(magic, 4) == "GGUF") return load_gguf(path, options);
    }
  }
  throw Error(ErrorKind::kUnsupported, fmt::format("{}: not a model directory or a .gguf file", path),
              "pass a Hugging Face model directory (config.json + safetensors) or a .gguf file");
}

}  // namespace loom
