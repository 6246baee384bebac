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

// Where one host/synthetic tensor lands: bf16, fp32 or e4m3 bytes, at `destination`.
struct Destination {
  void* pointer = nullptr;
  bool is_bf16 = true;
  bool fp8 = false;
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
    if (model.fp8()) {
      auto fp8_at = [](const Fp8Matrix& matrix, int64_t offset) {
        return Destination{const_cast<uint8_t*>(matrix.data) + offset, false, true};
      };
      map[prefix + "self_attn.q_proj.weight"] = fp8_at(layer.qkv_fp8, 0);
      map[prefix + "self_attn.k_proj.weight"] = fp8_at(layer.qkv_fp8, q_size * hidden);
      map[prefix + "self_attn.v_proj.weight"] = fp8_at(layer.qkv_fp8, (q_size + kv_size) * hidden);
      map[prefix + "self_attn.o_proj.weight"] = fp8_at(layer.o_fp8, 0);
      map[prefix + "mlp.gate_proj.weight"] = fp8_at(layer.gate_up_fp8, 0);
      map[prefix + "mlp.up_proj.weight"] = fp8_at(layer.gate_up_fp8, intermediate * hidden);
      map[prefix + "mlp.down_proj.weight"] = fp8_at(layer.down_fp8, 0);
    } else {
      map[prefix + "self_attn.q_proj.weight"] = bf16_at(layer.qkv_proj);
      map[prefix + "self_attn.k_proj.weight"] = bf16_at(layer.qkv_proj + q_size * hidden);
      map[prefix + "self_attn.v_proj.weight"] = bf16_at(layer.qkv_proj + (q_size + kv_size) * hidden);
      map[prefix + "self_attn.o_proj.weight"] = bf16_at(layer.o_proj);
      map[prefix + "mlp.gate_proj.weight"] = bf16_at(layer.gate_up_proj);
      map[prefix + "mlp.up_proj.weight"] = bf16_at(layer.gate_up_proj + intermediate * hidden);
      map[prefix + "mlp.down_proj.weight"] = bf16_at(layer.down_proj);
    }
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


// An FP8 checkpoint's linear weights: all of them e4m3 (the fused device matrices
// hold one format), or none.
bool checkpoint_is_fp8(const ModelWeights& weights) {
  if (!has_fp8_weights(weights)) return false;
  for (size_t l = 0; l < weights.layers.size(); ++l) {
    const LayerWeights& layer = weights.layers[l];
    for (const Tensor* tensor : {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.o_proj, &layer.gate_proj,
                                 &layer.up_proj, &layer.down_proj})
      if (!tensor->is_fp8())
        fail(ErrorKind::kUnsupported,
             "cuda backend: layer {} of this FP8 checkpoint keeps some linear weights unquantized (its ignore list); "
             "the GPU runs a checkpoint whose q/k/v/o and gate/up/down are all FP8 or none (use --device cpu)", l);
  }
  return true;
}

}  // namespace

// The scales of an uploaded FP8 checkpoint (layer by layer, the parts of each
// fused matrix in place). Per-channel checkpoints keep their rows' scales; with
// per-tensor ones a fused matrix whose parts' scales differ (q, k, v; gate, up)
// is requantized to the largest (as vLLM does), so it keeps one scale and
// cuBLASLt's per-tensor FP8 GEMM.
void DeviceModel::upload_fp8_scales(const ModelConfig& config, const ModelWeights& weights, cudaStream_t stream) {
  const int64_t hidden = config.hidden_size;
  const bool per_channel = config.quantization.weight_strategy == Fp8WeightStrategy::kChannel;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerWeights& from = weights.layers[l];
    DeviceLayer& to = layers_[l];
    auto place = [&](Fp8Matrix& matrix, std::initializer_list<const Tensor*> parts, int64_t cols) {
      std::vector<float> scales;
      for (const Tensor* part : parts)
        scales.insert(scales.end(), part->quantized.fp8.rows, part->quantized.fp8.rows + part->shape[0]);
      const auto rows = static_cast<int64_t>(scales.size());
      float* device_scales = const_cast<float*>(matrix.scale);
      LOOM_CUDA_CHECK(cudaMemcpyAsync(device_scales, scales.data(), rows * sizeof(float), cudaMemcpyHostToDevice,
                                      stream));
      const float largest = *std::max_element(scales.begin(), scales.end());
      const bool uniform = std::all_of(scales.begin(), scales.end(), [&](float s) { return s == largest; });
      matrix.per_channel = per_channel && !uniform;
      if (!per_channel && !uniform) {
        launch_fp8_requantize_rows(const_cast<uint8_t*>(matrix.data), device_scales, rows, cols, largest, stream);
        std::fill(scales.begin(), scales.end(), largest);
        LOOM_CUDA_CHECK(cudaMemcpyAsync(device_scales, scales.data(), rows * sizeof(float), cudaMemcpyHostToDevice,
                                        stream));
      }
      LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));  // `scales` is a host buffer of this scope
    };
    place(to.qkv_fp8, {&from.q_proj, &from.k_proj, &from.v_proj}, hidden);
    place(to.o_fp8, {&from.o_proj}, config.q_size());
    place(to.gate_up_fp8, {&from.gate_proj, &from.up_proj}, hidden);
    place(to.down_fp8, {&from.down_proj}, config.intermediate_size);
  }
}

DeviceModel DeviceModel::upload(const ModelConfig& config, const ModelWeights& weights, int device,
                                cudaStream_t stream) {
  DeviceModel model;
  const bool fp8 = checkpoint_is_fp8(weights);
  model.lay_out(config, same_values(weights.lm_head, weights.embed_tokens), fp8);
  upload_inverse_frequencies(config, model.inverse_frequencies_, stream);

  TensorMap tensors = model_weights_to_tensor_map(config, weights);
  tensors["lm_head.weight"] = weights.lm_head;  // whatever the config says about tying
  std::vector<WeightUpload> uploads;
  for (const auto& [name, destination] : destinations(config, model)) {
    const auto found = tensors.find(name);
    if (found == tensors.end()) fail(ErrorKind::kFormat, "cuda backend: tensor {} is missing", name);
    uploads.push_back({name, &found->second, destination.pointer, destination.is_bf16, destination.fp8});
  }
  const auto start = std::chrono::steady_clock::now();
  const WeightUploadStats stats = upload_weights(uploads, device);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("cuda backend: {:.2f} GiB of weights read and uploaded in {:.1f} s ({:.1f} GiB/s, {} streams)",
               static_cast<double>(stats.source_bytes) / (1 << 30), seconds,
               static_cast<double>(stats.source_bytes) / (1 << 30) / std::max(seconds, 1e-9), stats.num_workers);
  if (fp8) model.upload_fp8_scales(config, weights, stream);
  if (config.quantization.kv_cache_scales)
    for (const LayerWeights& layer : weights.layers) {
      model.k_cache_scales_.push_back(layer.k_cache_scale);
      model.v_cache_scales_.push_back(layer.v_cache_scale);
    }
  return model;
}

DeviceModel DeviceModel::synthetic(const ModelConfig& config, uint64_t seed, bool round_to_bf16, cudaStream_t stream,
                                   const TensorParallelShard* shard) {
  using Kind = TensorParallelSlice::Kind;
  const ModelConfig held = shard != nullptr ? rank_config(config, *shard) : config;
  DeviceModel model;
  model.lay_out(held, held.tie_word_embeddings);
  upload_inverse_frequencies(held, model.inverse_frequencies_, stream);
  const std::unordered_map<std::string, Destination> map = destinations(held, model);
  size_t drawn = 0;
  for (const SyntheticTensorSpec& spec : synthetic_base_tensor_specs(config)) {
    const TensorParallelSlice slice = shard != nullptr ? tensor_parallel_slice(config, *shard, spec.name)
                                                       : TensorParallelSlice{};
    if (slice.kind == Kind::kNone) continue;
    const auto found = map.find(spec.name);
    if (found == map.end()) fail(ErrorKind::kInternal, "cuda backend: no device tensor for synthetic {}", spec.name);
    // The rank's block of the tensor seen as rows of `columns` values (a 1-D tensor: one value a row).
    const int64_t columns = spec.shape.size() == 2 ? spec.shape[1] : 1;
    int64_t count = spec.numel();
    SyntheticWindow window;
    if (slice.kind == Kind::kRows) {
      window = {columns, columns, slice.begin, 0};
      count = (slice.end - slice.begin) * columns;
    } else if (slice.kind == Kind::kColumns) {
      window = {slice.end - slice.begin, columns, 0, slice.begin};
      count = spec.shape[0] * (slice.end - slice.begin);
    }
    const uint64_t tensor_seed = synthetic_tensor_seed(seed, spec.name);
    if (found->second.is_bf16) {
      launch_synthetic_fill_bf16(static_cast<__nv_bfloat16*>(found->second.pointer), count, tensor_seed, spec.is_norm,
                                 spec.scale, stream, window);
    } else {
      launch_synthetic_fill_f32(static_cast<float*>(found->second.pointer), count, tensor_seed, spec.is_norm,
                                spec.scale, round_to_bf16, stream, window);
    }
    ++drawn;
  }
  if (drawn != map.size())
    fail(ErrorKind::kInternal, "cuda backend: {} synthetic tensors for {} device tensors", drawn, map.size());
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
  return model;
}

}  // namespace loom::cuda
