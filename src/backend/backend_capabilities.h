// What a compute backend can run (Backend::capabilities()). The engine checks
// the model against it when the engine is built, and every adapter when it is
// loaded (engine/backend_support.h), so that nothing a backend's forward()
// would refuse ever reaches a batch: a request never fails because another
// request's adapter shares its batch. forward() keeps its own checks as a
// defence (they then fail the whole batch).
//
// A backend declares only what depends on the model or on an adapter; the
// shape of a batch is the engine's business and stays checked in forward().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lora/kv_sharing.h"

namespace loom {

struct ModelConfig;

// The KV cache's element type (--kv-cache-dtype, vLLM's flag; the engine's
// EngineConfig::kv_cache_dtype, the backend's pools and the blocks' content-hash
// salt, engine/kv_pools.cc).
//   kAuto     the backend's own: float32 on the CPU, bfloat16 on CUDA (the
//             flag's auto, and bf16 / bfloat16 where that is the backend's own)
//   kFp8E4M3  e4m3 (fp8, fp8_e4m3), on a backend with fp8_kv_cache
enum class KvCacheDtype { kAuto, kFp8E4M3 };
// "auto" / "fp8_e4m3".
const char* kv_cache_dtype_name(KvCacheDtype dtype);

struct BackendCapabilities {
  // Named in refusals: "cpu", "cuda".
  std::string name;
  // KV sharing modes (lora/kv_sharing.h) forward() runs.
  std::vector<KvSharing> kv_sharing_modes;
  // Attention head dims forward() runs; empty: any.
  std::vector<int32_t> head_dims;
  // hidden_size, intermediate_size and the q size (num_heads x head_dim) must
  // be multiples of this (1: anything).
  int32_t dimension_multiple = 1;
  // Largest rank of any LoRA module of an adapter (set_adapter refuses more); 0: any.
  int32_t max_lora_rank = 0;
  // Largest k/v LoRA rank of a forked adapter (its rCache entries and
  // ResidualAttention); 0: any.
  int32_t max_residual_rank = 0;
  // forward() honours Batch::sampling (backend.h DeviceSampling).
  bool device_sampling = false;
  // ... and DeviceSampling::mask_row / Backend::finish_forward's token masks (structured outputs on the device).
  bool device_token_masks = false;
  // ... and DeviceSampling's logit processing (penalties, logit_bias, min_p; Batch::logit_edits).
  bool device_logit_processing = false;
  // allocate_host_kv_cache / copy_kv_blocks work for the main pool.
  bool host_kv_tier = false;
  // ... and for the rCache pool (KvPoolKind::kResidual) of forked sharing.
  bool residual_host_kv_tier = false;
  // forward() leaves the host's cores idle (the work runs on a device), so the
  // engine may use them meanwhile: it samples the rows that come back as
  // logits in parallel. False for the CPU backend, whose forward owns them.
  bool host_cores_idle = false;
  // forward() honours Batch::capture_hidden_states (divergence tooling).
  bool capture_hidden_states = false;
  // FP8 linear weights run as FP8: e4m3 bytes and their scales on the device,
  // FP8 products (--quantization fp8; FP8 checkpoints, model/quantization.h,
  // uploaded as they are).
  bool fp8_weights = false;
  // FP8 checkpoints are accepted by dequantizing their weights at load instead
  // (the CPU's fp32 emulation: W8A16, activations never quantized).
  bool dequantizes_fp8_weights = false;
  // An FP8 (e4m3) KV cache, KvCacheDtype::kFp8E4M3: every pool, sharing mode and tier.
  bool fp8_kv_cache = false;
  // forward() honours Batch::kv_layer_listener and kv_pool_memory() answers:
  // the KV of a step can stream to another engine layer by layer.
  bool kv_layer_notifications = false;
  // Ranks the model and its KV are sharded over (model/tensor_parallel.h); a
  // KV block's bytes are laid out by rank, so this enters its content-hash salt.
  int32_t tensor_parallel_size = 1;

  bool supports(KvSharing mode) const;
  bool supports_head_dim(int32_t head_dim) const;
};

// Every mode: what the CPU reference backend runs.
std::vector<KvSharing> all_kv_sharing_modes();

// "isolated, activated" ("none" when empty), in KvSharing order.
std::string kv_sharing_list(const std::vector<KvSharing>& modes);

// Throws Error(kUnsupported), naming the backend, the value and what it runs,
// with a hint, when `capabilities` cannot run `model` at all (head_dim,
// dimension multiples, an FP8 checkpoint without fp8_weights or
// dequantizes_fp8_weights).
void check_model_capabilities(const BackendCapabilities& capabilities, const ModelConfig& model);

}  // namespace loom
