// A tiny base model configuration (vocab 64, hidden 8, 2 layers, 2 heads / 1 kv
// head of 4) for LoRA adapter tests that need only the base's shapes, no
// weights: tests/unit (file_readers_hardening_test) and tests/fuzz (the
// safetensors and adapter_config targets). Header only, so the fuzz build
// (which has no test library) can use it; include it by relative path.
#pragma once

#include "model/config.h"

namespace loom::test {

inline ModelConfig tiny_lora_base() {
  ModelConfig config;
  config.vocab_size = 64;
  config.hidden_size = 8;
  config.intermediate_size = 16;
  config.num_layers = 2;
  config.num_heads = 2;
  config.num_kv_heads = 1;
  config.head_dim = 4;
  config.max_position_embeddings = 64;
  return config;
}

}  // namespace loom::test
