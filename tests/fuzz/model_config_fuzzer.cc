// libFuzzer target: a Hugging Face config.json (model/hf_config.h), and
// writing the accepted config back.
#include <string_view>

#include "fuzz_util.h"
#include "model/hf_config.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  loom::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path =
      loom::fuzz::write_scratch_file("config.json", std::string_view(reinterpret_cast<const char*>(data), size));
  loom::fuzz::run_clean([&] {
    const loom::ModelConfig config = loom::read_hf_config(path);
    (void)config.q_size();
    (void)config.kv_size();
    loom::fuzz::run_clean([&] { (void)loom::hf_config_to_json(config).dump(); });
  });
  return 0;
}
