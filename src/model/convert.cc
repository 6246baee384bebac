#include "model/convert.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "formats/gguf.h"
#include "formats/safetensors.h"
#include "model/gguf_config.h"
#include "model/hf_config.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace loom {

namespace {

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream stream(path, std::ios::binary | std::ios::trunc);
  if (!stream) fail(ErrorKind::kInvalidArgument, "cannot create {}", path.string());
  stream << text;
  stream.flush();
  if (!stream) fail(ErrorKind::kInvalidArgument, "{}: write failed", path.string());
}

nlohmann::json token_ids_json(const std::vector<int>& ids) {
  if (ids.empty()) return nullptr;
  if (ids.size() == 1) return ids[0];
  return ids;
}

}  // namespace

void convert_gguf_to_hf(const std::string& gguf_path, const std::string& out_dir) {
  namespace fs = std::filesystem;
  GgufFile gguf = read_gguf(gguf_path);
  ModelConfig config = gguf_model_config(gguf);
  config.torch_dtype = "float32";
  const ModelWeights weights = build_model_weights(config, gguf.tensors, gguf_path);
  std::shared_ptr<const Tokenizer> tokenizer = Tokenizer::from_gguf(gguf);

  std::error_code error;
  fs::create_directories(out_dir, error);
  if (error || !fs::is_directory(out_dir))
    fail(ErrorKind::kInvalidArgument, "cannot create output directory {}: {}", out_dir, error.message());
  const fs::path out(out_dir);

  nlohmann::json config_json = hf_config_to_json(config);
  config_json["torch_dtype"] = "float32";  // transformers 4 spelling; 5 reads "dtype"
  if (gguf.has("tokenizer.ggml.padding_token_id"))
    config_json["pad_token_id"] = gguf.get_int("tokenizer.ggml.padding_token_id");
  write_text(out / "config.json", config_json.dump(2) + "\n");

  write_safetensors((out / "model.safetensors").string(), model_weights_to_tensor_map(config, weights),
                    StoredDtype::kF32);

  write_text(out / "tokenizer.json", tokenizer->to_hf_tokenizer_json());
  write_text(out / "tokenizer_config.json", tokenizer->to_hf_tokenizer_config_json());

  nlohmann::json generation = {
      {"bos_token_id", config.bos_token_id >= 0 ? nlohmann::json(config.bos_token_id) : nlohmann::json(nullptr)},
      {"eos_token_id", token_ids_json(config.eos_token_ids)},
  };
  if (gguf.has("tokenizer.ggml.padding_token_id"))
    generation["pad_token_id"] = gguf.get_int("tokenizer.ggml.padding_token_id");
  write_text(out / "generation_config.json", generation.dump(2) + "\n");
}

}  // namespace loom
