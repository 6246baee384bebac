// How an adapter's requests share KV with the base model and other adapters
// (docs/design.md §1). The mode is per adapter, fixed when it is loaded.
//
//   isolated   K/V from the adapted model, cached under the adapter's own key.
//   activated  aLoRA: the adapter applies from the invocation start on; K/V
//              before it are the base model's and are cached under the base key.
//   base       ICaRus: every K/V (prompt and generated) comes from the base model
//              (the logical encoder); the adapter only drives a "decoder row"
//              that predicts the next token. LoRA on k_proj/v_proj is ignored.
//   forked     ForkKV: a shared bCache (base projections of the writer's x) plus a
//              per-adapter residual rCache (x·A_k, x·A_v, r values each).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace loom {

struct LoraConfig;
struct LoraAdapter;
struct ModelConfig;

enum class KvSharing : uint8_t { kIsolated, kActivated, kBase, kForked };

// "isolated", "activated", "base", "forked".
const char* kv_sharing_name(KvSharing sharing);
// nullopt for anything else (callers turn that into an error with the allowed names).
std::optional<KvSharing> parse_kv_sharing(std::string_view text);

// The mode an adapter gets (docs/design.md §1), first that applies:
//   `requested` (CLI `NAME=PATH:MODE`, load body "kv_sharing"),
//   adapter_config.json "loom_kv_sharing",
//   activated when the config has alora_invocation_tokens,
//   `server_default` (--default-sharing; isolated unless set) — but never
//   activated for an adapter without invocation tokens (isolated then).
// Throws Error(kInvalidArgument) for an unknown loom_kv_sharing spelling.
KvSharing choose_kv_sharing(const LoraConfig& config, std::optional<KvSharing> requested,
                            KvSharing server_default);

// Throws Error(kInvalidArgument / kUnsupported), with a hint, when `adapter`
// cannot be served in `sharing` on `model`: activated without
// alora_invocation_tokens; forked on a model with q/k norm (RMSNorm on K does not
// commute with the residual split). Returns a warning to log ("" if none), e.g.
// "base" mode ignoring the adapter's k_proj/v_proj LoRA.
std::string check_kv_sharing(KvSharing sharing, const LoraAdapter& adapter, const ModelConfig& model);

// PEFT's calculate_alora_offsets: the index where the LAST occurrence of
// `invocation_tokens` starts in `prompt`, or nullopt (the base model answers).
std::optional<int32_t> find_alora_invocation_start(std::span<const int32_t> prompt,
                                                   std::span<const int32_t> invocation_tokens);

}  // namespace loom
