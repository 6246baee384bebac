// `loom convert GGUF OUT_DIR`: a GGUF file -> a Hugging Face model directory.
#pragma once

#include <string>

namespace loom {

// Writes into `out_dir` (created if missing; existing files of the same names
// are replaced):
//   config.json             hf_config_to_json(gguf_model_config), dtype float32
//   model.safetensors       every weight as f32, exactly the dequantized values
//                           Loom uses (lm_head omitted when tied)
//   tokenizer.json          the GGUF vocabulary as a HF tokenizer
//   tokenizer_config.json   chat template, bos/eos, add_bos_token
//   generation_config.json  bos/eos (and pad when the GGUF names one)
// transformers' from_pretrained(out_dir) then computes the same logits as its
// own from_pretrained(gguf_file=...). Throws loom::Error (see read_gguf,
// build_model_weights) for bad input; Error(kInvalidArgument) when out_dir
// cannot be written.
void convert_gguf_to_hf(const std::string& gguf_path, const std::string& out_dir);

}  // namespace loom
