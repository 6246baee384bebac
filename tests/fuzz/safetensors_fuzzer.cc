// libFuzzer target: safetensors files (formats/safetensors.h), and the same bytes
// as a LoRA adapter's adapter_model.safetensors (tensor names, shapes) for a
// tiny base model.
#include <cmath>
#include <string_view>

#include "../common/tiny_lora_base.h"
#include "formats/safetensors.h"
#include "fuzz_util.h"
#include "lora/adapter.h"
#include "lora/adapter_config.h"

namespace {

// Reads every element, so ASan sees any view past the mapping or buffer.
float touch(const loom::TensorMap& tensors) {
  float sum = 0.0f;
  for (const auto& [name, tensor] : tensors) {
    const int64_t count = tensor.numel();
    for (int64_t i = 0; i < count; ++i) sum += std::fabs(tensor.data[i]) > 0.0f ? 1.0f : 0.0f;
  }
  return sum;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  loom::fuzz::quiet_logs();
  // An adapter directory whose config targets every projection with rank 2.
  loom::LoraConfig config;
  config.rank = 2;
  config.alpha = 4.0f;
  config.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  std::filesystem::create_directories(loom::fuzz::ScratchDir::path() / "adapter");
  loom::fuzz::write_scratch_file("adapter/adapter_config.json", loom::lora_config_to_json(config).dump());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  const std::string path = loom::fuzz::write_scratch_file("model.safetensors", bytes);
  loom::fuzz::run_clean([&] { loom::fuzz::keep(touch(loom::read_safetensors(path))); });

  loom::fuzz::write_scratch_file("adapter/adapter_model.safetensors", bytes);
  loom::fuzz::run_clean([&] {
    const auto adapter = loom::load_lora_adapter("fuzz", (loom::fuzz::ScratchDir::path() / "adapter").string(),
                                                 loom::test::tiny_lora_base());
    (void)adapter->max_rank();
  });
  return 0;
}
