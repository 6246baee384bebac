#include "backend/cuda/device_model.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <unordered_map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/weight_upload.h"
#include "backend/rope.h"
#include "synthetic/synthetic_weights.h"
#include "util/error.h"

namespace loom::cuda {

namespace {

// Hands out 256-byte aligned pieces of one allocation: first a dry run that
// only counts, then the real one over the allocated base.
class Arena {
 public:
  explicit Arena(char* base) : base_(base) {}
  template <typename T>
  T* take(int64_t count) {
    offset_ = (offset_ + 255) / 256 * 256;
    T* pointer = reinterpret_cast<T*>(base_ + offset_);
    offset_ += count * static_cast<int64_t>(sizeof(T));
    return pointer;
  }
  int64_t size() const { return offset_; }

 private:
  char* base_;
  int64_t offset_ = 0;
};

// Where one host/synthetic tensor lands: bf16 or fp32, at `destination`.
struct Destination {
  void* pointer = nullptr;
  bool is_bf16 = true;
};

}  // namespace

void DeviceModel::lay_out(const ModelConfig& config, bool tied, bool fp8) {
  fp8_ = fp8;
  const int64_t hidden = config.hidden_size;
  const int64_t qkv = config.q_size() + 2 * config.kv_size();
  const int64_t intermediate = config.intermediate_size;
  const int64_t vocab = config.vocab_size;
  auto plan = [&](Arena& arena) {
    layers_.assign(config.num_layers, {});
    embed_tokens_ = arena.take<__nv_bfloat16>(vocab * hidden);
    lm_head_ = tied ? embed_tokens_ : arena.take<__nv_bfloat16>(vocab * hidden);
    final_norm_ = arena.take<float>(hidden);
    inverse_frequencies_ = arena.take<float>(config.head_dim / 2);
    auto take_fp8 = [&](int64_t rows, int64_t cols) {
      Fp8Matrix matrix;
      matrix.data = arena.take<uint8_t>(rows * cols);
      matrix.scale = arena.take<float>(rows);
      return matrix;
    };
    for (DeviceLayer& layer : layers_) {
      if (fp8) {
        layer.qkv_fp8 = take_fp8(qkv, hidden);
        layer.o_fp8 = take_fp8(hidden, config.q_size());
        layer.gate_up_fp8 = take_fp8(2 * intermediate, hidden);
        layer.down_fp8 = take_fp8(hidden, intermediate);
      } else {
        layer.qkv_proj = arena.take<__nv_bfloat16>(qkv * hidden);
        layer.o_proj = arena.take<__nv_bfloat16>(hidden * config.q_size());
        layer.gate_up_proj = arena.take<__nv_bfloat16>(2 * intermediate * hidden);
        layer.down_proj = arena.take<__nv_bfloat16>(hidden * intermediate);
      }
      layer.input_norm = arena.take<float>(hidden);
      layer.post_attention_norm = arena.take<float>(hidden);
      if (config.qkv_bias) layer.qkv_bias = arena.take<float>(qkv);
      if (config.o_bias) layer.o_bias = arena.take<float>(hidden);
      if (config.qk_norm) {
        layer.q_norm = arena.take<float>(config.head_dim);
        layer.k_norm = arena.take<float>(config.head_dim);
      }
    }
  };
  Arena counting(nullptr);
  plan(counting);
  storage_.allocate(static_cast<size_t>(counting.size()));
  Arena real(storage_.as<char>());
  plan(real);
}

void DeviceModel::convert_to_fp8(const ModelConfig& config, cudaStream_t stream, bool per_channel) {
  if (fp8_) return;
  const int64_t hidden = config.hidden_size;
  const int64_t q_size = config.q_size();
  const int64_t qkv = q_size + 2 * config.kv_size();
  const int64_t intermediate = config.intermediate_size;
  const bool tied = lm_head_ == embed_tokens_;
  DeviceModel next;
  next.lay_out(config, tied, /*fp8=*/true);
  auto copy = [&](const void* to, const void* from, int64_t bytes) {
    if (from != nullptr && bytes > 0)
      LOOM_CUDA_CHECK(cudaMemcpyAsync(const_cast<void*>(to), from, bytes, cudaMemcpyDeviceToDevice, stream));
  };
  const int64_t bf16_bytes = sizeof(__nv_bfloat16), f32_bytes = sizeof(float);
  copy(next.embed_tokens_, embed_tokens_, config.vocab_size * hidden * bf16_bytes);
  if (!tied) copy(next.lm_head_, lm_head_, config.vocab_size * hidden * bf16_bytes);
  copy(next.final_norm_, final_norm_, hidden * f32_bytes);
  copy(next.inverse_frequencies_, inverse_frequencies_, config.head_dim / 2 * f32_bytes);
  DeviceBuffer sync(kFp8QuantizeSyncWords * sizeof(uint32_t));
  LOOM_CUDA_CHECK(cudaMemsetAsync(sync.data(), 0, sync.size(), stream));
  auto quantize = [&](const __nv_bfloat16* from, int64_t rows, int64_t cols, Fp8Matrix& to) {
    to.per_channel = per_channel;
    uint8_t* data = const_cast<uint8_t*>(to.data);
    float* scales = const_cast<float*>(to.scale);
    if (per_channel)
      launch_fp8_quantize_rows(from, rows, cols, cols, data, scales, stream);
    else
      launch_fp8_quantize_tensor(from, rows, cols, cols, data, scales, rows, sync.as<uint32_t>(), stream);
  };
  for (size_t l = 0; l < layers_.size(); ++l) {
    const DeviceLayer& from = layers_[l];
    DeviceLayer& to = next.layers_[l];
    quantize(from.qkv_proj, qkv, hidden, to.qkv_fp8);
    quantize(from.o_proj, hidden, q_size, to.o_fp8);
    quantize(from.gate_up_proj, 2 * intermediate, hidden, to.gate_up_fp8);
    quantize(from.down_proj, hidden, intermediate, to.down_fp8);
    copy(to.input_norm, from.input_norm, hidden * f32_bytes);
    copy(to.post_attention_norm, from.post_attention_norm, hidden * f32_bytes);
    copy(to.qkv_bias, from.qkv_bias, qkv * f32_bytes);
    copy(to.o_bias, from.o_bias, hidden * f32_bytes);
    copy(to.q_norm, from.q_norm, config.head_dim * f32_bytes);
    copy(to.k_norm, from.k_norm, config.head_dim * f32_bytes);
  }
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  const int64_t before = weight_bytes();
  *this = std::move(next);
  spdlog::info("cuda backend: linear weights in FP8 (e4m3, per-{} scales): {:.2f} GiB -> {:.2f} GiB",
               per_channel ? "channel" : "tensor", static_cast<double>(before) / (1 << 30),
               static_cast<double>(weight_bytes()) / (1 << 30));
}

namespace {

// HF tensor name -> device destination, for every tensor of the model.
std::unordered_map<std::string, Destination> destinations(const ModelConfig& config, const DeviceModel& model) {
  std::unordered_map<std::string, Destination> map;
  auto bf16_at = [](const __nv_bfloat16* pointer) { return Destination{const_cast<__nv_bfloat16*>(pointer), true}; };
  auto f32_at = [](const float* pointer) { return Destination{const_cast<float*>(pointer), false}; };
  const int64_t hidden = config.hidden_size;
  const int64_t q_size = config.q_size();
  const int64_t kv_size = config.kv_size();
  const int64_t intermediate = config.intermediate_size;
  map["model.embed_tokens.weight"] = bf16_at(model.embed_tokens());
  if (model.lm_head() != model.embed_tokens()) map["lm_head.weight"] = bf16_at(model.lm_head());
  map["model.norm.weight"] = f32_at(model.final_norm());
  for (int l = 0; l < config.num_layers; ++l) {
    const DeviceLayer& layer = model.layers()[l];
    const std::string prefix = fmt::format("model.layers.{}.", l);
    map[prefix + "input_layernorm.weight"] = f32_at(layer.input_norm);
    map[prefix + "post_attention_layernorm.weight"] = f32_at(layer.post_attention_norm);
    map[prefix + "self_attn.q_proj.weight"] = bf16_at(layer.qkv_proj);
    map[prefix + "self_attn.k_proj.weight"] = bf16_at(layer.qkv_proj + q_size * hidden);
    map[prefix + "self_attn.v_proj.weight"] = bf16_at(layer.qkv_proj + (q_size + kv_size) * hidden);
    map[prefix + "self_attn.o_proj.weight"] = bf16_at(layer.o_proj);
    map[prefix + "mlp.gate_proj.weight"] = bf16_at(layer.gate_up_proj);
    map[prefix + "mlp.up_proj.weight"] = bf16_at(layer.gate_up_proj + intermediate * hidden);
    map[prefix + "mlp.down_proj.weight"] = bf16_at(layer.down_proj);
    if (layer.qkv_bias != nullptr) {
      map[prefix + "self_attn.q_proj.bias"] = f32_at(layer.qkv_bias);
      map[prefix + "self_attn.k_proj.bias"] = f32_at(layer.qkv_bias + q_size);
      map[prefix + "self_attn.v_proj.bias"] = f32_at(layer.qkv_bias + q_size + kv_size);
    }
    if (layer.o_bias != nullptr) map[prefix + "self_attn.o_proj.bias"] = f32_at(layer.o_bias);
    if (layer.q_norm != nullptr) {
      map[prefix + "self_attn.q_norm.weight"] = f32_at(layer.q_norm);
      map[prefix + "self_attn.k_norm.weight"] = f32_at(layer.k_norm);
    }
  }
  return map;
}

// Whether two tensors view the same values (a tied lm_head), in whatever format they are kept.
bool same_values(const Tensor& a, const Tensor& b) {
  if (a.is_quantized() || b.is_quantized()) return a.quantized.bytes == b.quantized.bytes;
  return a.data != nullptr && a.data == b.data;
}

void upload_inverse_frequencies(const ModelConfig& config, const float* destination, cudaStream_t stream) {
  const Rope rope(config);
  LOOM_CUDA_CHECK(cudaMemcpyAsync(const_cast<float*>(destination), rope.inverse_frequencies().data(),
                                  rope.inverse_frequencies().size() * sizeof(float), cudaMemcpyHostToDevice, stream));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace

DeviceModel DeviceModel::upload(const ModelConfig& config, const ModelWeights& weights, int device,
                                cudaStream_t stream) {
  DeviceModel model;
  model.lay_out(config, same_values(weights.lm_head, weights.embed_tokens));
  upload_inverse_frequencies(config, model.inverse_frequencies_, stream);

  TensorMap tensors = model_weights_to_tensor_map(config, weights);
  tensors["lm_head.weight"] = weights.lm_head;  // whatever the config says about tying
  std::vector<WeightUpload> uploads;
  for (const auto& [name, destination] : destinations(config, model)) {
    const auto found = tensors.find(name);
    if (found == tensors.end()) fail(ErrorKind::kFormat, "cuda backend: tensor {} is missing", name);
    uploads.push_back({name, &found->second, destination.pointer, destination.is_bf16});
  }
  const auto start = std::chrono::steady_clock::now();
  const WeightUploadStats stats = upload_weights(uploads, device);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("cuda backend: {:.2f} GiB of weights read and uploaded in {:.1f} s ({:.1f} GiB/s, {} streams)",
               static_cast<double>(stats.source_bytes) / (1 << 30), seconds,
               static_cast<double>(stats.source_bytes) / (1 << 30) / std::max(seconds, 1e-9), stats.num_workers);
  return model;
}

DeviceModel DeviceModel::synthetic(const ModelConfig& config, uint64_t seed, bool round_to_bf16, cudaStream_t stream) {
  DeviceModel model;
  model.lay_out(config, config.tie_word_embeddings);
  upload_inverse_frequencies(config, model.inverse_frequencies_, stream);
  const std::unordered_map<std::string, Destination> map = destinations(config, model);
  const std::vector<SyntheticTensorSpec> specs = synthetic_base_tensor_specs(config);
  if (specs.size() != map.size())
    fail(ErrorKind::kInternal, "cuda backend: {} synthetic tensors for {} device tensors", specs.size(), map.size());
  for (const SyntheticTensorSpec& spec : specs) {
    const auto found = map.find(spec.name);
    if (found == map.end()) fail(ErrorKind::kInternal, "cuda backend: no device tensor for synthetic {}", spec.name);
    const uint64_t tensor_seed = synthetic_tensor_seed(seed, spec.name);
    if (found->second.is_bf16) {
      launch_synthetic_fill_bf16(static_cast<__nv_bfloat16*>(found->second.pointer), spec.numel(), tensor_seed,
                                 spec.is_norm, spec.scale, stream);
    } else {
      launch_synthetic_fill_f32(static_cast<float*>(found->second.pointer), spec.numel(), tensor_seed, spec.is_norm,
                                spec.scale, round_to_bf16, stream);
    }
  }
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  return model;
}

}  // namespace loom::cuda
