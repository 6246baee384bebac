// `loom serve`'s configuration in three steps:
//
//   ServeOptions   what the flags say, as CLI11 binds them (add_serve_flags): sizes already in bytes,
//                  vLLM's spellings (vllm_flags.h) beside Loom's
//   resolve()      -> ResolvedServe: the engine's, the server's (with its transport) and the KV link's
//                  configurations, the adapters, the device, the GPU memory share; pure but for reading
//                  the files the flags name (--chat-template, generation_config.json, the default model)
//   validate()     every rule between flags, each checked here once, with one wording
//
// Then the model's config is known: check_context_limit() and effective_config(), the JSON --dry-run
// prints and the start logs.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/device_backend.h"
#include "cli/kv_transfer_setup.h"
#include "cli/vllm_flags.h"
#include "engine/engine.h"
#include "model/config.h"
#include "server/http_server.h"

namespace loom::cli {

// The GPU memory share the KV pool sizes itself to when neither a share nor a size is given (vLLM's).
inline constexpr double kDefaultGpuMemoryFraction = 0.9;

// The flags. Fields of `engine` and `server` that a flag sets as-is are bound there directly.
struct ServeOptions {
  std::string model;                  // --model ("" = the built-in default; random:... specs too)
  std::vector<std::string> loras;     // --lora NAME=PATH[:MODE]
  std::string device = "cpu";
  double gpu_memory_fraction = 0.0;   // --gpu-memory-fraction (0 = not given)
  std::string chat_template;          // --chat-template FILE|STRING
  std::string default_sharing = "isolated";
  std::string eviction_policy = "lru";
  std::string host_load_policy = "background";  // --host-load-policy background|blocking
  std::string preemption_mode = "recompute";    // --preemption-mode recompute|swap
  std::optional<int64_t> kv_cache_bytes;  // --kv-cache-bytes (nullopt: the engine's default, or the GPU share)
  std::optional<int32_t> block_size;      // --block-size (nullopt: default_block_size(device))
  int threads = 0;
  std::string cpu_precision = "auto";
  bool enforce_eager = false;         // cuda: no CUDA graphs
  double shutdown_timeout_seconds = 30.0;
  double log_stats_interval_seconds = 10.0;
  std::string generation_config = "auto";
  bool dry_run = false;
  KvTransferOptions kv_transfer;      // --role, --kv-transfer-host/-port/-backend, --kv-buffer-bytes
  VllmFlags vllm;
  // --host, --port, --api-key, --served-model-name (empty: the model's file name), the transport limits, ...
  server::ServerConfig server;
  // --max-batch-tokens, ..., and the sizes of the host and disk tiers (--host-kv-memory, --disk-kv-bytes,
  // --residual-kv-cache-memory and --host-residual-kv-memory with -1 for auto, ...).
  EngineConfig engine;
};

// Registers every `loom serve` flag on `app`, bound to `options` (which must outlive parsing). A size that
// parse_byte_size refuses throws Error(kInvalidArgument) out of the parse, naming its flag.
void add_serve_flags(CLI::App& app, ServeOptions& options);

struct ResolvedServe {
  std::string model_path;             // --model, or the default model's path
  EngineConfig engine;
  server::ServerConfig server;        // served_model_names filled in; model_path; sampling defaults
  KvTransferOptions kv_transfer;
  std::vector<LoraSpec> adapters;     // --lora, then --lora-modules
  DeviceOptions device;
  // > 0: the KV pool is sized at start to leave (1 - this) of the GPU's memory free (engine.kv_cache_bytes
  // is then replaced); 0: engine.kv_cache_bytes as it is.
  double gpu_memory_fraction = 0.0;
  bool dry_run = false;
  double shutdown_timeout_seconds = 30.0;
  double log_stats_interval_seconds = 10.0;  // 0: no stats lines (--disable-log-stats too)
};

// The flags as the configurations the engine, the server and the KV link take. Throws
// Error(kInvalidArgument) for a value it cannot read (a bad --lora or --lora-modules entry, --default-sharing,
// --kv-events-config, --generation-config that is not a directory), and the errors of the files it reads
// (--chat-template, the default model when --model is not given).
ResolvedServe resolve(const ServeOptions& options);

// Every rule between the flags, each once; throws Error(kInvalidArgument) naming the flags of the first one
// broken:
//   vLLM flags Loom refuses, parallel sizes, --dtype, --kv-cache-dtype (check_vllm_flags)
//   --kv-cache-bytes above 0
//   --disk-kv-path needs a host tier (--host-kv-memory, or a KV buffer's) and --disk-kv-bytes
//   --gpu-memory-fraction / --gpu-memory-utilization only on a cuda device
//   served model names and adapter names all distinct
//   --chat-template parses
void validate(const ServeOptions& options, const ResolvedServe& serve);

// --max-context-tokens / --max-model-len against the model's limit. Returns the context length the engine
// runs with (the model's when none was given); throws Error(kInvalidArgument) above the limit.
int32_t check_context_limit(const EngineConfig& engine, const ModelConfig& model);

// The configuration `loom serve` runs with, as --dry-run prints it and the start logs it.
nlohmann::json effective_config(const ResolvedServe& serve, int32_t max_context_tokens);

}  // namespace loom::cli
