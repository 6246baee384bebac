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
  // forward() honours Batch::capture_hidden_states (divergence tooling).
  bool capture_hidden_states = false;
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
// dimension multiples).
void check_model_capabilities(const BackendCapabilities& capabilities, const ModelConfig& model);

}  // namespace loom
