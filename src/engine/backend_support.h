// Whether the engine can serve something on its backend, decided up front:
// the model and the engine's config when the engine is built, each adapter
// when it is loaded (at start or at run time), against
//   - what the backend runs (Backend::capabilities(), backend_capabilities.h), and
//   - what the operator allows (EngineConfig::disabled_kv_sharing,
//     `--disable-kv-sharing MODE[,MODE]`).
// A refusal is an Error(kUnsupported) with a hint, saying which of the two
// refused, so `loom serve` exits at start with it and POST
// /v1/load_lora_adapter answers 400. Nothing a backend refuses ever reaches a
// batch, so no request fails because another request's adapter shares its
// batch (forward()'s own checks stay as a defence).
//
// Pure functions; any thread.
#pragma once

#include <string>
#include <vector>

#include "backend/backend_capabilities.h"
#include "engine/engine.h"

namespace loom {

struct LoraAdapter;
struct ModelConfig;

// The modes adapters may use: the backend's, less the disabled ones (KvSharing order).
std::vector<KvSharing> allowed_kv_sharing(const BackendCapabilities& capabilities,
                                          const std::vector<KvSharing>& disabled);

// Throws Error(kUnsupported) unless `mode` is allowed, e.g.
//   "adapter 'critic': kv_sharing 'base' is not supported by the cuda backend (supported: isolated, activated)"
//   "adapter 'critic': kv_sharing 'base' is disabled on this server by --disable-kv-sharing (allowed: isolated,
//    activated, forked)"
// `subject` starts the message ("adapter 'critic'", "--default-sharing"); `hint` says what to do instead.
void check_kv_sharing_allowed(const BackendCapabilities& capabilities, const std::vector<KvSharing>& disabled,
                              KvSharing mode, const std::string& subject, const std::string& hint);

// At engine construction: the model (check_model_capabilities: an FP8
// checkpoint among others), the default sharing, an FP8 KV cache, a host tier
// (and one for the rCache) and an rCache pool asked for explicitly. Throws
// Error(kUnsupported) with a hint.
void check_engine_supported(const BackendCapabilities& capabilities, const EngineConfig& config,
                            const ModelConfig& model);

// When `adapter` is loaded in `mode` (the mode choose_kv_sharing gave it):
// the mode is allowed and every module's rank is within the backend's.
// Throws Error(kUnsupported) naming the adapter, with a hint that lists the
// modes it could be loaded with instead.
void check_adapter_supported(const BackendCapabilities& capabilities, const std::vector<KvSharing>& disabled,
                             const LoraAdapter& adapter, KvSharing mode);

}  // namespace loom
