// libFuzzer target: adapter_config.json (lora/adapter_config.h), then PEFT's
// module matching (regexes, layer selection, rank/alpha patterns) against a
// tiny base model, as loading an adapter does before reading its weights.
#include <string_view>

#include "../common/tiny_lora_base.h"
#include "fuzz_util.h"
#include "lora/adapter_config.h"
#include "lora/peft_matching.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  loom::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = loom::fuzz::write_scratch_file(
      "adapter_config.json", std::string_view(reinterpret_cast<const char*>(data), size));
  loom::fuzz::run_clean([&] {
    const loom::LoraConfig config = loom::read_lora_config(path);
    loom::ModelConfig base = loom::test::tiny_lora_base();
    base.num_layers = 3;
    base.qk_norm = size % 2 == 0;  // Qwen3's extra modules half the time
    (void)loom::plan_lora_modules(config, base, path);
    (void)loom::lora_config_to_json(config).dump();
  });
  return 0;
}
