// Sampling defaults a model ships in its generation_config.json, applied as
// vLLM applies them (`--generation-config auto`, its default): a request that
// does not set temperature, top_p, top_k, min_p or repetition_penalty gets the
// file's value instead of OpenAI's default. Other keys (do_sample, bos/eos,
// max_new_tokens, ...) are not sampling defaults here and are ignored.
#pragma once

#include <optional>
#include <string>

namespace loom::server {

struct SamplingDefaults {
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;  // 0 or -1: no limit
  double min_p = 0.0;
  double repetition_penalty = 1.0;
  std::string source;  // the file they came from; "" = OpenAI's defaults

  bool operator==(const SamplingDefaults&) const = default;
};

// The defaults in DIR/generation_config.json; OpenAI's when the file is absent.
// Throws Error(kFormat) naming the file and key for malformed JSON or a value
// out of the range a request may give.
SamplingDefaults read_generation_config(const std::string& directory);

}  // namespace loom::server
