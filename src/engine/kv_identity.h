// Content identity of what a KV block depends on (kv/kv_block_hash.h): the
// model, each adapter, the KV layout. The disk tier names blocks from these,
// so two processes serving the same weights compute the same names, and a
// process serving other weights (or another layout) never reads them.
//
// Fingerprints hash the configuration exactly and the weights by sample: each
// tensor's name, shape and up to 3 x 64 KiB of its data (start, middle, end).
// Two checkpoints that differ only outside every sample would collide; a fine-
// tune changes every weight, so in practice they never do, and the cost stays
// a few milliseconds for an 8B model instead of hashing 16 GB at start. An FP8
// weight adds all of its row scales and its input scale (formats/tensor.h).
//
// Thread: any (pure functions).
#pragma once

#include <string>

#include "backend/backend_capabilities.h"
#include "kv/kv_block_hash.h"
#include "lora/adapter.h"
#include "model/config.h"
#include "model/loader.h"
#include "model/weights.h"

namespace loom {

KvBlockHash model_fingerprint(const ModelConfig& config, const ModelWeights& weights);
// The same for a loaded model; one without host weights (a random model drawn
// on the device, `random:SPEC`) is named by its path (the spec, seed included)
// and its config.
KvBlockHash model_fingerprint(const LoadedModel& model);
// The identity an engine names its blocks under: the model's fingerprint, and
// the weight format the backend computes with when that is not the file's
// (`--quantization fp8`: quantized at load, EngineConfig::fp8_weights). The
// file's own format needs nothing more: its weights are what is sampled.
KvBlockHash engine_model_identity(const LoadedModel& model, bool fp8_weights);
KvBlockHash adapter_fingerprint(const LoraAdapter& adapter);
// What a cache's blocks are laid out as, beside the model.
struct KvCacheLayoutSpec {
  int32_t block_size = 0;
  // Bytes per block: the head shape or rCache rank and the element size, so a
  // CPU fp32 pool never reads a CUDA bf16 one.
  int64_t bytes_per_block = 0;
  // The ranks whose shares a block lays out one after the other.
  int32_t tensor_parallel_size = 1;
  // The element type named outright (an fp8 block never reads as a bf16 one,
  // whatever their sizes).
  KvCacheDtype dtype = KvCacheDtype::kAuto;
};
// "block_size=16 bytes_per_block=131072", then " tensor_parallel=N" when N > 1 and
// " kv_dtype=fp8_e4m3" for an FP8 cache: the spelling of the original layouts
// is unchanged, so their blocks keep their names.
std::string kv_cache_layout_spelling(const KvCacheLayoutSpec& layout);
// The salt at the start of every chain in one cache: model, `layout` (the
// cache's dtype, block size and head shape or rCache rank, spelled by the
// caller: kv_cache_layout_spelling) and the member's name ("main", "residual").
KvBlockHash kv_cache_salt(const KvBlockHash& model, const std::string& layout, const std::string& member);

}  // namespace loom
