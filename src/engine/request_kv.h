// How one request's KV is keyed and how its tokens run, from its adapter's
// KV sharing mode (docs/design.md §1, lora/kv_sharing.h). Pure host code, built once
// per request at submit().
//
//   adapter mode   RequestKvKeys                       tokens in the batch
//   (base model)   "base"                              slot -1
//   isolated       "lora/NAME"                         slot on every token
//   activated      "base" | "alora/NAME@S" from the    -1 before S, the slot from S on
//                  block of S (S = invocation start)   (generated tokens included)
//     no invocation in the prompt: the base model answers ("base", slot -1)
//   base           "base"                              slot -1 + decoder row of the slot
//   forked         "fork" + residual "resid/NAME"      slot on every token, forked slot
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "lora/kv_sharing.h"
#include "scheduler/scheduler.h"

namespace loom {

struct LoraAdapter;

// What the batch builder needs to lay out one request's tokens.
struct SequenceSharing {
  int32_t adapter_slot = -1;  // -1: the base model answers (no adapter math at all)
  KvSharing sharing = KvSharing::kIsolated;
  int32_t invocation_start = 0;  // activated: the adapter applies to tokens [invocation_start, ...)
};

struct RequestKvPlan {
  RequestKvKeys kv;
  SequenceSharing sharing;
  // The adapter as the scheduler counts it against max_loras_per_batch: ""
  // when the base model answers (also for an activated adapter not invoked).
  std::string scheduler_adapter;
  // Metrics label: "none" (the base model), "isolated", "activated", "base",
  // "forked". The label is the adapter's mode: an activated adapter whose
  // invocation is absent (the base model answers) still reports "activated".
  std::string mode_label;
};

// `adapter` is nullptr for the base model (adapter_name ""); `slot` its bound
// backend slot. `prompt` is only read (for the aLoRA invocation start).
RequestKvPlan plan_request_kv(const std::string& adapter_name, const LoraAdapter* adapter, KvSharing sharing,
                              int32_t slot, std::span<const int32_t> prompt, int32_t block_size);

}  // namespace loom
