// `loom serve`'s flags (serve_config.h), in the order --help lists them, one function per group.
#include "cli/serve_config.h"

namespace loom::cli {
namespace {

// The model, its names and adapters, the device, and the API in front of them.
void add_model_and_api_flags(CLI::App& app, ServeOptions& options) {
  server::ServerConfig& server = options.server;
  app.add_option("--model", options.model, "Hugging Face directory or .gguf file (default: built-in SmolLM2-135M)");
  app.add_option("--served-model-name", server.served_model_names,
                 "Base model names in requests, one or more (the first is the one responses carry; default: the "
                 "file name)");
  app.add_option("--host", server.http.host, "Address to bind (default 127.0.0.1)");
  app.add_option("--port", server.http.port, "Port (default 8000; 0 = any free port)")->check(CLI::Range(0, 65535));
  app.add_option("--lora", options.loras, "Adapter NAME=PATH[:MODE] (repeatable)");
  app.add_option("--device", options.device, "cpu, cuda or cuda:N (builds with the CUDA backend)");
  app.add_option("--gpu-memory-fraction", options.gpu_memory_fraction,
                 "cuda: size the KV pool so that this fraction of GPU memory is used (overrides --kv-cache-bytes)");
  app.add_option("--api-key", server.api_key, "Require Authorization: Bearer KEY on /v1/*");
  app.add_flag("--allow-runtime-lora", server.allow_runtime_lora,
               "Enable POST /v1/load_lora_adapter and /v1/unload_lora_adapter");
  app.add_option("--lora-dir", server.lora_dir, "Runtime adapters must lie under this directory");
  app.add_option("--tool-call-parser", server.tool_call_parser,
                 "How chat outputs are read for tool calls (tool_choice auto): auto (from the chat template), "
                 "hermes, llama3_json, mistral, none")
      ->check(CLI::IsMember({"auto", "none", "hermes", "llama3_json", "mistral"}));
  app.add_option("--reasoning-parser", server.reasoning_parser,
                 "Split a reasoning model's <think>...</think> from chat answers into reasoning_content: "
                 "auto (from the chat template and the vocabulary's <think> tokens; the choice is logged), qwen3, "
                 "deepseek_r1, none")
      ->check(CLI::IsMember({"auto", "none", "qwen3", "deepseek_r1"}))->capture_default_str();
  app.add_option("--chat-template", options.chat_template,
                 "Jinja chat template replacing the model's: a file, or the template text (as vLLM's); checked at "
                 "start-up");
}

// The HTTP transport's limits and deadlines (server/http_transport.h).
void add_transport_flags(CLI::App& app, ServeOptions& options) {
  server::TransportConfig& http = options.server.http;
  app.add_flag("--metrics-require-api-key", options.server.metrics_require_api_key,
               "Also require the --api-key on GET /metrics");
  app.add_option("--max-request-bytes", http.max_request_bytes,
                 "Larger request bodies get 413, whatever the transfer encoding (suffix K, M, G allowed)")
      ->transform(byte_size_transform())->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--max-header-bytes", http.max_header_bytes, "Larger request line + headers get 431")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--max-header-count", http.max_header_count, "More request header lines get 431")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--header-timeout", http.header_timeout_seconds,
                 "Seconds from a request's first byte to the end of its headers; then 408")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--body-timeout", http.body_timeout_seconds,
                 "Seconds from the end of the headers to the end of the body; then 408")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--keep-alive-timeout", http.keep_alive_timeout_seconds,
                 "Seconds an idle connection stays open between requests")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--write-timeout", http.write_timeout_seconds,
                 "Seconds one write of a response may wait for a client that does not read; then it is dropped")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--max-connections", http.max_connections, "Open connections at most; beyond, 503 and close")
      ->check(CLI::PositiveNumber)->capture_default_str();
}

// Sampling defaults, the stats log, shutdown; then what one request may ask for.
void add_serving_flags(CLI::App& app, ServeOptions& options) {
  app.add_option("--generation-config", options.generation_config,
                 "Sampling defaults for requests that omit them (temperature, top_p, top_k, min_p, "
                 "repetition_penalty), as vLLM: auto = the model directory's generation_config.json, vllm = "
                 "OpenAI's defaults, or a directory holding a generation_config.json")
      ->capture_default_str();
  app.add_option("--log-stats-interval", options.log_stats_interval_seconds,
                 "Seconds between stats lines in the log (throughput, running / waiting requests, KV cache usage "
                 "per tier, prefix-cache hit rate), as vLLM logs them; only while the server has work; 0 = none "
                 "(vLLM's --disable-log-stats)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--shutdown-timeout", options.shutdown_timeout_seconds,
                 "On SIGINT/SIGTERM: seconds requests in flight may take to finish before they are ended with an "
                 "error")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  server::RequestLimits& limits = options.server.request_limits;
  app.add_option("--max-n", limits.max_n, "Largest `n` (choices per prompt) a request may ask for")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--max-stop-strings", limits.max_stop_strings, "Most entries in a request's `stop`")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--max-stop-string-bytes", limits.max_stop_string_bytes, "Longest stop string, in bytes")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--max-request-output-tokens", limits.max_request_output_tokens,
                 "Most output tokens one request may ask for: prompts x n x max_tokens")
      ->check(CLI::PositiveNumber)->capture_default_str();
  server::ResponseStoreConfig& store = options.server.responses_store;
  app.add_option("--responses-store-max-entries", store.max_entries,
                 "/v1/responses kept for previous_response_id and GET /v1/responses/{id} at most; the oldest go "
                 "first (0 = none kept)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--responses-store-max-bytes", store.max_bytes,
                 "Bytes the stored responses (bodies and conversations) may hold; the oldest go first (suffix K, "
                 "M, G allowed)")
      ->transform(byte_size_transform("--responses-store-max-bytes"))->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--responses-store-ttl", store.ttl_seconds,
                 "Seconds a stored response is kept (0 = until evicted by the bounds)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
}

// The engine's batches and its device KV pool.
void add_engine_flags(CLI::App& app, ServeOptions& options) {
  EngineConfig& engine = options.engine;
  app.add_option("--max-batch-tokens", engine.max_batch_tokens, "Tokens per forward step")->check(CLI::PositiveNumber);
  app.add_option("--max-running-requests", engine.max_running_requests, "Requests in the running batch at most")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-waiting-requests", engine.max_waiting_requests, "Queued requests beyond this get 503")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-loras-per-batch", engine.max_loras_per_batch, "Distinct adapters in one batch at most")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-context-tokens", engine.max_context_tokens, "Prompt + output limit (0 = the model's)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--block-size", options.block_size, "KV block size in tokens (default: 4 on cpu, 16 on cuda)")
      ->check(CLI::PositiveNumber);
  app.add_option("--kv-cache-bytes", options.kv_cache_bytes,
                 "KV cache pool size: BYTES (suffix K, M, G allowed; rCache included; default 1G on the CPU, "
                 "--gpu-memory-fraction 0.9 on a GPU)")
      ->transform(byte_size_transform("--kv-cache-bytes"));
  app.add_option("--default-sharing", options.default_sharing,
                 "KV sharing of adapters that choose none: isolated (default), base, forked (activated only for "
                 "aLoRA adapters, which get it anyway)")
      ->check(CLI::IsMember({"isolated", "activated", "base", "forked"}));
  add_disable_kv_sharing_option(app, engine.disabled_kv_sharing);
  app.add_option("--residual-kv-cache-memory", engine.residual_kv_cache_bytes,
                 "Forked adapters' rCache pool, taken out of --kv-cache-bytes: BYTES (suffix K, M, G allowed), 0 = "
                 "none, auto (default) = 1/8 of the KV cache when a forked adapter is loaded at start")
      ->transform(byte_size_or_auto_transform("--residual-kv-cache-memory"))
      ->default_str("auto");
  app.add_option("--max-lora-rank", engine.max_lora_rank,
                 "Largest k/v LoRA rank of a forked adapter (0 = the largest loaded at start, at least 16)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--eviction-policy", options.eviction_policy,
                 "Which cached KV blocks go first: lru (default) or workflow (KVFlow: dynamic suffixes, then agents' "
                 "fixed prefixes by steps-to-execution, furthest first; see PUT /v1/workflows/{id})")
      ->check(CLI::IsMember({"lru", "workflow"}));
}

// The host and disk tiers below the device pool.
void add_kv_tier_flags(CLI::App& app, ServeOptions& options) {
  EngineConfig& engine = options.engine;
  app.add_option("--host-kv-memory", engine.host_kv_cache_bytes,
                 "Host-memory tier of the KV cache: BYTES (suffix K, M, G allowed; 0 = none, the default). Cached "
                 "blocks are backed up there and evicted blocks load back instead of being recomputed. Shared with "
                 "the forked adapters' rCache pool when there is one (see --host-residual-kv-memory)")
      ->transform(byte_size_transform("--host-kv-memory"));
  app.add_option("--host-load-policy", options.host_load_policy,
                 "With a host tier, a request whose cached prefix loads back from host memory: background "
                 "(default; it waits while other requests run, status-aware admission) or blocking (it keeps its "
                 "place in line and the step waits for its load, as SGLang HiCache's load-back: the KVFlow paper's "
                 "baseline)")
      ->check(CLI::IsMember({"background", "blocking"}))
      ->capture_default_str();
  app.add_option("--preemption-mode", options.preemption_mode,
                 "What preempting a running request does with its KV (vLLM's flag): recompute (default; its "
                 "blocks are released, full ones stay cached, and it recomputes what the cache lost) or swap (its "
                 "private blocks are copied to the host tier and it resumes where it was; needs --host-kv-memory; "
                 "recomputes when the host tier has no room, counted in loom_swap_fallbacks_total)")
      ->check(CLI::IsMember({"recompute", "swap"}))
      ->capture_default_str();
  app.add_option("--host-residual-kv-memory", engine.host_residual_kv_cache_bytes,
                 "The forked rCache pool's part of --host-kv-memory: BYTES (suffix K, M, G allowed), 0 = no host "
                 "tier for the rCache, auto (default) = its share of the device KV bytes (each pool's host tier "
                 "then holds the same multiple of its device pool)")
      ->transform(byte_size_or_auto_transform("--host-residual-kv-memory"))
      ->default_str("auto");
  app.add_option("--disk-kv-path", engine.disk_kv_path,
                 "Disk / shared-storage tier of the KV cache below the host tier: a directory of content-addressed "
                 "block files (created if missing) that several servers may share, on a local disk or NFS / CephFS "
                 "/ 3FS. Needs --host-kv-memory and --disk-kv-bytes. Blocks are written through when backed up to "
                 "the host and read back disk -> host -> device");
  app.add_option("--disk-kv-bytes", engine.disk_kv_bytes,
                 "Cap on the --disk-kv-path directory's block files, across every server using it: BYTES (suffix "
                 "K, M, G allowed); the least recently used files go first")
      ->transform(byte_size_transform("--disk-kv-bytes"));
  app.add_flag("--disk-kv-warm-start", engine.disk_kv_warm_start,
               "Index the blocks already in --disk-kv-path at start (a restart is warm at once; without it blocks "
               "there are still found one lookup at a time)");
  app.add_option("--disk-kv-read-bandwidth", engine.disk_kv_read_bandwidth,
                 "Pace disk-tier reads to BYTES per second (suffix K, M, G allowed; 0 = unpaced): emulates a slower "
                 "network store on one machine")
      ->transform(byte_size_transform("--disk-kv-read-bandwidth"));
}

// Prefill/decode disaggregation (kv_transfer_setup.h).
void add_kv_transfer_flags(CLI::App& app, KvTransferOptions& kv_transfer) {
  app.add_option("--role", kv_transfer.role,
                 "Prefill/decode disaggregation behind `loom router`: prefill, decode or both. prefill and decode "
                 "engines get a KV buffer (--kv-buffer-bytes, over --disk-kv-path when given) and a KV link on "
                 "--kv-transfer-port; the router tells them about each other")
      ->check(CLI::IsMember({"prefill", "decode", "both"}));
  app.add_option("--kv-transfer-port", kv_transfer.port,
                 "Port of the KV link other engines push blocks to (0 = a free one, the default for prefill / "
                 "decode; -1 = none; /loom/kv/status reports it)")
      ->check(CLI::Range(-1, 65535));
  app.add_option("--kv-transfer-host", kv_transfer.host,
                 "Address the KV link listens on, and announces to the router (not --host: the link is its own "
                 "trust domain). Anything but loopback needs --kv-transfer-secret-file")
      ->capture_default_str();
  app.add_option("--kv-transfer-secret-file", kv_transfer.secret_file,
                 "File holding the secret every engine and the router share (e.g. openssl rand -hex 32): each KV "
                 "link connection proves it (challenge-response, HMAC-SHA256 on every message) and /loom/kv/* "
                 "calls must be signed with it. Without one the link stays on loopback, unauthenticated");
  app.add_option("--kv-transfer-secret", kv_transfer.secret,
                 "The shared secret itself (visible to local users in the process list: prefer "
                 "--kv-transfer-secret-file)");
  app.add_option("--kv-transfer-peers", kv_transfer.peers,
                 "KV links /loom/kv/send may push to: HOST:PORT,... (HOST:* for any port of a host); default: "
                 "loopback addresses only");
  app.add_option("--kv-transfer-backend", kv_transfer.backend,
                 "How the KV link moves block payloads: tcp (inline on its TCP connection), nccl (GPU to GPU "
                 "through NCCL between --device cuda:N engines; NCCL is loaded at run time, LOOM_NCCL_LIBRARY names "
                 "libnccl.so.2 when the loader cannot find it) or auto (nccl on a CUDA device when NCCL loads, else "
                 "tcp). A peer without the same plane gets payloads inline")
      ->check(CLI::IsMember({"auto", "tcp", "nccl"}))
      ->capture_default_str();
  app.add_option("--kv-device-plane", kv_transfer.device_plane,
                 "Device-to-device KV between prefill and decode engines (layer by layer into the decode engine's "
                 "reserved blocks, chosen by loom router when both engines report the same plane): none (staged "
                 "path only), auto (the plane the backend supports: cuda-ipc on a GPU engine, socket on a CPU one, "
                 "with tensor parallelism too, rank to rank between engines of the same size), cuda-ipc (GPU engines of "
                 "one host: the prefill engine copies into the decode engine's pools through CUDA IPC, set up over "
                 "the KV link's handshake) or socket "
                 "(CPU engines, over TCP with the KV link's handshake and sealed messages)")
      ->check(CLI::IsMember({"auto", "none", "socket", "cuda-ipc"}))
      ->capture_default_str();
  app.add_option("--kv-device-plane-port", kv_transfer.device_plane_port,
                 "Port the device KV plane listens on, on --kv-transfer-host (0 = a free one; /loom/kv/status "
                 "reports it)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--kv-buffer-bytes", kv_transfer.buffer_bytes,
                 "Memory for KV blocks moving between engines (DualPath's engine buffer): BYTES, suffix K, M, G")
      ->transform(byte_size_transform("--kv-buffer-bytes"))
      ->default_str("1G");
}

// Workflow graphs: prefetch from the host tier, and the registry's bounds.
void add_workflow_flags(CLI::App& app, EngineConfig& engine) {
  app.add_option("--prefetch-agents", engine.prefetch_agents,
                 "With a host tier: load back the fixed prefixes of this many agents closest to running, from the "
                 "workflow graphs (0 = no prefetch; default 2)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--prefetch-max-bytes", engine.prefetch_max_bytes,
                 "With a host tier: KV bytes one step may start prefetching (0 = no limit but the pool)")
      ->transform(byte_size_transform("--prefetch-max-bytes"));
  app.add_option("--workflow-ttl-seconds", engine.workflow_ttl_seconds,
                 "Workflows without a request or API call for this long are forgotten (default 600)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-workflows", engine.max_workflows,
                 "Workflows known at once; a new one beyond gets 503 (requests naming one are served untracked)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--max-workflow-agents", engine.max_workflow_agents,
                 "Agents in one workflow graph (declared or named in `after`) and entries per progress list")
      ->check(CLI::PositiveNumber)->capture_default_str();
}

// Threads, precision, CUDA graphs, handler threads, and --dry-run.
void add_process_flags(CLI::App& app, ServeOptions& options) {
  app.add_option("--threads", options.threads, "CPU threads (0 = all cores)");
  app.add_option("--cpu-precision", options.cpu_precision, kCpuPrecisionHelp)
      ->check(CLI::IsMember({"auto", "fp32"}))
      ->capture_default_str();
  app.add_flag("--enforce-eager", options.enforce_eager,
               "cuda: run every step eagerly (default: decode steps replay CUDA graphs captured per batch shape)");
  app.add_option("--http-threads", options.server.http.num_handler_threads,
                 "Requests handled at once (a streaming or waiting request holds one; idle connections none)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  app.add_flag("--dry-run", options.dry_run,
               "Check the flags and the model's config, print the effective configuration as JSON and exit");
}

}  // namespace

void add_serve_flags(CLI::App& app, ServeOptions& options) {
  add_model_and_api_flags(app, options);
  add_transport_flags(app, options);
  add_serving_flags(app, options);
  add_engine_flags(app, options);
  add_kv_tier_flags(app, options);
  add_kv_transfer_flags(app, options.kv_transfer);
  add_workflow_flags(app, options.engine);
  add_process_flags(app, options);
  add_vllm_flags(app, options.vllm);
}

}  // namespace loom::cli
