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

// Reads every element (or, of rows kept in their file format, every byte), so
// ASan sees any view past the mapping or buffer.
float touch(const loom::TensorMap& tensors) {
  float sum = 0.0f;
  for (const auto& [name, tensor] : tensors) {
    if (tensor.is_quantized()) {
      const int64_t count = tensor.shape[0] * tensor.quantized.row_bytes;
      for (int64_t i = 0; i < count; ++i) sum += tensor.quantized.bytes[i] != 0 ? 1.0f : 0.0f;
      continue;
    }
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
  // As model loading reads: 16-bit and F8_E4M3 matrices kept as rows in the mapping, then expanded.
  loom::fuzz::run_clean([&] {
    const loom::TensorMap rows = loom::read_safetensors(path, {.keep_16bit = true, .keep_fp8 = true});
    loom::fuzz::keep(touch(rows));
    for (const auto& entry : rows)  // (a structured binding cannot be captured before C++20 clang 16)
      loom::fuzz::run_clean([&] { loom::fuzz::keep(touch({{entry.first, loom::to_fp32(entry.second)}})); });
  });

  loom::fuzz::write_scratch_file("adapter/adapter_model.safetensors", bytes);
  loom::fuzz::run_clean([&] {
    const auto adapter = loom::load_lora_adapter("fuzz", (loom::fuzz::ScratchDir::path() / "adapter").string(),
                                                 loom::test::tiny_lora_base());
    (void)adapter->max_rank();
  });
  return 0;
}
