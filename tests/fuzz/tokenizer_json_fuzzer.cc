// libFuzzer target: tokenizer.json (+ tokenizer_config.json) loading
// (Tokenizer::from_hf_json_file), then encoding and decoding with the result.
//
// Input: tokenizer.json, optionally followed by a NUL byte and a
// tokenizer_config.json (JSON text never holds a raw NUL).
#include <string_view>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  loom::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string tokenizer_path = loom::fuzz::write_scratch_file("tokenizer.json", input.substr(0, nul));
  std::string config_path;
  if (nul != std::string_view::npos)
    config_path = loom::fuzz::write_scratch_file("tokenizer_config.json", input.substr(nul + 1));
  loom::fuzz::run_clean([&] {
    const auto tokenizer = loom::Tokenizer::from_hf_json_file(tokenizer_path, config_path);
    // The input itself is hostile text too (invalid UTF-8 included).
    for (std::string_view text : {std::string_view("Hello <|im_start|> wörld 123\n\t  !"), input.substr(0, 256)}) {
      const std::vector<loom::TokenId> ids = tokenizer->encode(text);
      (void)tokenizer->decode(ids);
      (void)tokenizer->decode(ids, /*skip_special_tokens=*/true);
    }
    std::vector<loom::TokenId> probes = {-1, 0, 1, tokenizer->vocab_size() - 1, tokenizer->vocab_size()};
    for (loom::TokenId id : probes) {
      (void)tokenizer->token_bytes(id);
      (void)tokenizer->is_special(id);
    }
    (void)tokenizer->decode(probes);
    (void)tokenizer->to_hf_tokenizer_json();
    (void)tokenizer->to_hf_tokenizer_config_json();
    (void)tokenizer->chat_template().render({{"system", "s"}, {"user", "u"}});
  });
  return 0;
}
