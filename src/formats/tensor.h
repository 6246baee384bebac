// Tensor: a named fp32 host array with shared storage, the unit every file
// format in formats/ reads and writes (and model/ builds ModelWeights from).
//
// Ownership: a Tensor views `data`, which stays valid while `storage` lives;
// storage is either a memory-mapped file (f32 safetensors, used in place) or an
// owned buffer (converted f16/bf16, dequantized GGUF). Immutable after loading.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace loom {

struct Tensor {
  std::vector<int64_t> shape;
  const float* data = nullptr;
  std::shared_ptr<const void> storage;

  bool empty() const { return data == nullptr; }
  int64_t numel() const {
    int64_t count = 1;
    for (int64_t dim : shape) count *= dim;
    return shape.empty() ? 0 : count;
  }
  // A tensor that owns a copy of `values`.
  static Tensor from_vector(std::vector<int64_t> shape, std::vector<float> values);
};

// Name -> tensor, names as in Hugging Face checkpoints ("model.layers.0.self_attn.q_proj.weight").
using TensorMap = std::unordered_map<std::string, Tensor>;

}  // namespace loom
