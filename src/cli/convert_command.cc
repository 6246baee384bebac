// `loom convert GGUF OUT_DIR`.
#include <spdlog/spdlog.h>

#include "cli/commands.h"
#include "model/convert.h"

namespace loom::cli {

CommandRunner register_convert(CLI::App& app) {
  auto gguf_path = std::make_shared<std::string>();
  auto out_dir = std::make_shared<std::string>();
  app.add_option("GGUF", *gguf_path, "GGUF file (llama family)")->required();
  app.add_option("OUT_DIR", *out_dir, "Directory to write config.json, model.safetensors, tokenizer.json")
      ->required();
  return [gguf_path, out_dir] {
    convert_gguf_to_hf(*gguf_path, *out_dir);
    spdlog::info("wrote {}", *out_dir);
    return 0;
  };
}

}  // namespace loom::cli
