// Offline batched generation: a fixed set of requests run together to the end.
// A test oracle (tests/oracles, linked only by tests and benchmarks): the serving
// Engine must produce what it produces; `loom generate` runs through the Engine.
//
// Thread: one caller at a time; it drives the backend synchronously.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/generation_result.h"
#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"

namespace loom {

struct GenerationRequest {
  std::vector<TokenId> prompt_tokens;  // non-empty
  int32_t adapter_slot = -1;           // bound in the backend beforehand; -1 = base
  SamplingParams sampling;
  int32_t max_new_tokens = 64;
  std::vector<std::string> stop_strings;  // generation ends before the first match
  bool ignore_eos = false;
};

struct GeneratorConfig {
  int32_t block_size = 16;
  // Tokens per forward call across the batch; long prompts are prefilled in chunks.
  int32_t max_batch_tokens = 2048;
  // Longest prompt + max_new_tokens accepted (the model's max_position_embeddings).
  int32_t max_context_tokens = 0;
};

// Called as text becomes final (never splits a UTF-8 character, never includes
// a stop string), for streaming output.
using TextCallback = std::function<void(size_t request_index, const std::string& text_delta)>;

class Generator {
 public:
  Generator(Backend& backend, std::shared_ptr<const Tokenizer> tokenizer, GeneratorConfig config);

  // Runs all requests to completion. Allocates the backend's KV cache to fit
  // them. Throws Error(kCapacity) when a request exceeds max_context_tokens,
  // Error(kInvalidArgument) for an empty prompt.
  std::vector<GenerationResult> generate(const std::vector<GenerationRequest>& requests,
                                         const TextCallback& on_text = {});

 private:
  Backend& backend_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  GeneratorConfig config_;
};

}  // namespace loom
