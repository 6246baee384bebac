// vLLM's `vllm serve` flags on `loom serve`, so that a vLLM command line runs
// with the binary renamed: aliases with vLLM's meaning where Loom has the
// feature, accepted no-ops where Loom always behaves as the flag asks, and a
// clear error naming Loom's equivalent (or saying there is none) for the rest.
//
//   vLLM                                   Loom
//   --lora-modules NAME=PATH | JSON ...    --lora NAME=PATH (JSON: {"name", "path"[, "base_model_name"]})
//   --max-num-seqs N                       --max-running-requests N
//   --max-num-batched-tokens N             --max-batch-tokens N
//   --max-model-len N                      --max-context-tokens N (both checked against the model's limit)
//   --gpu-memory-utilization F             --gpu-memory-fraction F (cuda)
//   --max-loras N                          --max-loras-per-batch N
//   --seed N                               seeds of requests that give none drawn from N (reproducible runs)
//   --dtype auto|bfloat16|float32 ...      must be auto or the backend's own (cpu float32, cuda bfloat16)
//   --kv-cache-dtype auto|bf16|fp8|...     auto (the backend's own: cpu float32, cuda bfloat16); bf16 / bfloat16
//                                          where that is the backend's own; fp8 / fp8_e4m3 on cuda when the
//                                          backend declares an FP8 KV cache (refused on the CPU); fp8_e5m2 refused
//   --tensor-parallel-size / -tp 1, --pipeline-parallel-size / -pp 1: one device per server (main.cc
//   spells -tp / -pp out: CLI11 takes one-character short names only)
//   --disable-custom-all-reduce            cuda -tp: every sum on NCCL (default: decode-sized sums on
//                                          Loom's peer-access kernel, backend/cuda/peer_all_reduce.h)
//   --enable-prefix-caching, --enable-lora, --enable-chunked-prefill, --enable-auto-tool-choice,
//   --trust-remote-code, --disable-log-stats, --disable-log-requests: accepted (Loom always does / never
//   runs model code); --no-enable-prefix-caching refused (sharing KV is what Loom is for)
//   --kv-events-config JSON                KV events for routers: vLLM's JSON ({"enable_kv_cache_events": true,
//                                          "publisher": "zmq", "endpoint": ..., "topic": ..., "hwm": ...};
//                                          replay_endpoint refused, buffer_steps / max_queue_size ignored)
//   --swap-space, --cpu-offload-gb, --quantization, --speculative-config, --tokenizer, --download-dir, ...:
//   refused, naming the equivalent.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend/backend_capabilities.h"
#include "kvevents/kv_events_config.h"

namespace loom::cli {

struct VllmFlags {
  std::vector<std::string> lora_modules;
  int max_num_seqs = 0;            // 0: not given
  int max_num_batched_tokens = 0;
  int max_model_len = 0;
  double gpu_memory_utilization = 0.0;
  int max_loras = 0;
  int64_t seed = 0;
  const CLI::Option* seed_option = nullptr;  // given when count() > 0
  std::string dtype = "auto";
  std::string kv_cache_dtype = "auto";
  std::string quantization;  // --quantization / -q: "" or fp8 (cuda)
  int tensor_parallel_size = 1;
  int pipeline_parallel_size = 1;
  bool no_enable_prefix_caching = false;
  bool disable_log_requests = false;
  bool disable_log_stats = false;
  bool disable_custom_all_reduce = false;
  std::string kv_events_config;  // --kv-events-config JSON ("" = none)
  // Flags Loom does not have, with what to use instead (given when count() > 0).
  std::vector<std::pair<const CLI::Option*, std::string>> refused;

  std::optional<int64_t> given_seed() const {
    return seed_option && seed_option->count() > 0 ? std::optional<int64_t>(seed) : std::nullopt;
  }
};

// Registers the flags on `app` (group "vLLM compatibility"); `flags` must outlive parsing.
void add_vllm_flags(CLI::App& app, VllmFlags& flags);

// Throws Error(kInvalidArgument) for a refused flag that was given, a parallel
// size other than 1, a dtype or KV cache dtype Loom does not run on `device`,
// or --no-enable-prefix-caching, naming Loom's equivalent.
void check_vllm_flags(const VllmFlags& flags, const std::string& device);

// --kv-cache-dtype (serve, generate) on `device`: auto, bf16 / bfloat16 (cuda:
// the backend's own, so auto), fp8 / fp8_e4m3 (cuda: e4m3; the engine then
// checks BackendCapabilities::fp8_kv_cache). Throws Error(kInvalidArgument)
// naming the flag for fp8 on the CPU (as --quantization fp8 is), bf16 on the
// CPU, fp8_e5m2 and anything else.
KvCacheDtype parse_kv_cache_dtype(const std::string& value, const std::string& device);
// The KV cache's element type as the effective configuration shows it:
// "float32" (auto on cpu), "bfloat16" (auto on cuda), "fp8_e4m3".
std::string kv_cache_dtype_label(KvCacheDtype dtype, const std::string& device);

// vLLM's multi-character short flags (-tp, -pp) in their long spelling, for CLI11.
std::string long_vllm_spelling(const std::string& argument);

// vLLM's --kv-events-config JSON (KVEventsConfig: enable_kv_cache_events,
// publisher "zmq" | "null", endpoint, topic, hwm, replay_endpoint,
// buffer_steps, max_queue_size) as Loom's. Events are enabled when
// enable_kv_cache_events is true and the publisher is "zmq" (its default
// then). Throws Error(kInvalidArgument) for bad JSON, an unknown key, a value
// of the wrong type, another publisher, or a replay_endpoint (Loom serves no
// replays), naming what to give instead.
KvEventsConfig parse_kv_events_config(const std::string& json);

// --lora-modules entries as --lora specs (NAME=PATH). An entry is NAME=PATH or
// a JSON object {"name": ..., "path": ..., "base_model_name": ...} (vLLM's
// forms). Throws Error(kInvalidArgument) naming the entry.
std::vector<std::string> lora_specs_from_modules(const std::vector<std::string>& modules);

}  // namespace loom::cli
