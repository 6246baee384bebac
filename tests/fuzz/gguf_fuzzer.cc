// libFuzzer target: GGUF files (formats/gguf.h, model/gguf_config.h): the container, the model config
// from its metadata and the tokenizer from its vocabulary, as `--model x.gguf` does.
#include <cmath>
#include <string_view>

#include "formats/gguf.h"
#include "fuzz_util.h"
#include "model/gguf_config.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  loom::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path =
      loom::fuzz::write_scratch_file("model.gguf", std::string_view(reinterpret_cast<const char*>(data), size));
  loom::fuzz::run_clean([&] {
    const loom::GgufFile gguf = loom::read_gguf(path);
    float sum = 0.0f;
    for (const auto& [name, tensor] : gguf.tensors)
      for (int64_t i = 0; i < tensor.numel(); ++i) sum += std::isnan(tensor.data[i]) ? 1.0f : 0.0f;
    loom::fuzz::keep(sum);
    loom::fuzz::run_clean([&] { (void)loom::gguf_model_config(gguf); });
    loom::fuzz::run_clean([&] {
      const auto tokenizer = loom::Tokenizer::from_gguf(gguf);
      const std::vector<loom::TokenId> ids = tokenizer->encode("Hello, world! 123 <|im_end|>");
      (void)tokenizer->decode(ids);
    });
  });
  return 0;
}
