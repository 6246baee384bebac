// `loom serve`'s configuration without a process (cli/serve_config.h): the
// flags parsed as the binary parses them, resolve() (defaults per device,
// vLLM's spellings, sizes with suffixes) and validate() (each rule broken once,
// the error naming the flags).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <memory>

#include "cli/serve_config.h"
#include "test_util.h"

namespace loom::cli {
namespace {

using nlohmann::json;

constexpr const char* kModel = "random:llama-tiny";  // resolve() reads nothing for it

class ServeConfigTest : public ::testing::Test {
 protected:
  // `loom serve --model random:llama-tiny ARGS` as the binary parses it (vLLM's -tp spelled out).
  ServeOptions& parse(std::vector<std::string> args) {
    app_ = std::make_unique<CLI::App>();
    options_ = std::make_unique<ServeOptions>();
    add_serve_flags(*app_, *options_);
    args.insert(args.begin(), {"--model", kModel});
    std::reverse(args.begin(), args.end());  // CLI11 takes the vector last argument first
    app_->parse(args);
    return *options_;
  }
  ResolvedServe resolved(const std::vector<std::string>& args) { return resolve(parse(args)); }
  // resolve() then validate(), as run_serve does.
  ResolvedServe checked(const std::vector<std::string>& args) {
    ResolvedServe serve = resolved(args);
    validate(*options_, serve);
    return serve;
  }
  json effective(const std::vector<std::string>& args, int32_t max_context_tokens = 4096) {
    return effective_config(checked(args), max_context_tokens);
  }
  void expect_invalid(const std::vector<std::string>& args, std::initializer_list<std::string> needles) {
    SCOPED_TRACE(::testing::PrintToString(args));
    test::expect_error([&] { checked(args); }, ErrorKind::kInvalidArgument, needles);
  }

  std::unique_ptr<CLI::App> app_;
  std::unique_ptr<ServeOptions> options_;
};

TEST_F(ServeConfigTest, DefaultsOnTheCpu) {
  const ResolvedServe serve = checked({});
  EXPECT_EQ(serve.model_path, kModel);
  EXPECT_EQ(serve.engine.block_size, 4);
  EXPECT_EQ(serve.engine.kv_cache_bytes, int64_t{1} << 30);
  EXPECT_EQ(serve.gpu_memory_fraction, 0.0);
  EXPECT_EQ(serve.engine.residual_kv_cache_bytes, -1);       // auto
  EXPECT_EQ(serve.engine.host_residual_kv_cache_bytes, -1);  // auto
  EXPECT_EQ(serve.engine.host_kv_cache_bytes, 0);
  EXPECT_EQ(serve.engine.default_sharing, KvSharing::kIsolated);
  EXPECT_FALSE(serve.engine.workflow_aware_eviction);
  EXPECT_FALSE(serve.engine.blocking_host_loads);
  EXPECT_FALSE(serve.engine.kv_events.enabled);
  EXPECT_EQ(serve.server.served_model_names, std::vector<std::string>{kModel});
  EXPECT_EQ(serve.server.served_model_name(), kModel);
  EXPECT_EQ(serve.server.model_path, kModel);
  EXPECT_EQ(serve.server.http.host, "127.0.0.1");
  EXPECT_EQ(serve.server.http.port, 8000);
  EXPECT_FALSE(serve.server.seed);
  EXPECT_TRUE(serve.server.log_requests);
  EXPECT_TRUE(serve.server.chat_template.empty());
  EXPECT_TRUE(serve.adapters.empty());
  EXPECT_FALSE(serve.kv_transfer.has_buffer());
  EXPECT_EQ(serve.device.device, "cpu");
  EXPECT_TRUE(serve.device.cuda_graphs);
  EXPECT_TRUE(serve.device.cpu_keep_quantized);
  EXPECT_FALSE(serve.dry_run);
  EXPECT_EQ(serve.shutdown_timeout_seconds, 30.0);
  EXPECT_EQ(serve.log_stats_interval_seconds, 10.0);

  const json config = effective_config(serve, 2048);
  EXPECT_EQ(config["max_context_tokens"], 2048);
  EXPECT_EQ(config["kv_cache_bytes"], int64_t{1} << 30);
  EXPECT_EQ(config["kv_buffer_bytes"], nullptr);  // no buffer for role both without a port
  EXPECT_EQ(config["disk_kv_path"], nullptr);
  EXPECT_EQ(config["generation_config"], nullptr);
  EXPECT_EQ(config["chat_template"], "model");
  EXPECT_EQ(config["eviction_policy"], "lru");
  EXPECT_EQ(config["host_load_policy"], "background");
  EXPECT_EQ(config["preemption_mode"], "recompute");
  EXPECT_EQ(config["default_sharing"], "isolated");
  EXPECT_EQ(config["cuda_graphs"], true);
  EXPECT_EQ(config["custom_all_reduce"], true);
  EXPECT_EQ(config["api_key"], false);
  EXPECT_EQ(config["seed"], nullptr);
  EXPECT_EQ(config["kv_events"], nullptr);
  EXPECT_EQ(config["responses_store"]["max_entries"], 1024);
  EXPECT_EQ(config["tensor_parallel_size"], 1);
  EXPECT_EQ(config["reasoning_parser"], "auto");
  EXPECT_EQ(config["quantization"], nullptr);
  EXPECT_EQ(config["kv_cache_dtype"], "float32");  // auto: the CPU backend's own
  EXPECT_EQ(config["kv_transfer_host"], "127.0.0.1");  // loopback, whatever --host is
  EXPECT_EQ(config["kv_transfer_secret"], false);
  EXPECT_EQ(config["kv_transfer_peers"], nullptr);
  EXPECT_EQ(config["kv_device_plane"], "none");  // opt in: the staged path only by default
  EXPECT_EQ(config.size(), 46u) << config.dump(2);  // the keys --dry-run prints, no more
}

TEST_F(ServeConfigTest, DeviceKvPlaneAutoIsSocketOnASingleRankCpuEngineAndNoneOnCuda) {
  EXPECT_EQ(checked({"--role", "prefill", "--kv-device-plane", "socket"}).kv_transfer.device_plane, "socket");
  EXPECT_EQ(resolve_device_kv_plane("auto", "cpu", 1), "socket");
  EXPECT_EQ(resolve_device_kv_plane("auto", "cpu", 2), "socket");  // the group's ranks, rank to rank
  EXPECT_EQ(resolve_device_kv_plane("auto", "cuda:0", 1), "cuda-ipc");
  EXPECT_EQ(resolve_device_kv_plane("auto", "cuda:0", 2), "cuda-ipc");
  EXPECT_EQ(resolve_device_kv_plane("cuda-ipc", "cuda:1", 1), "cuda-ipc");
  EXPECT_THROW(resolve_device_kv_plane("cuda-ipc", "cpu", 1), Error);
  EXPECT_EQ(resolve_device_kv_plane("cuda-ipc", "cuda:0", 2), "cuda-ipc");
  EXPECT_EQ(resolve_device_kv_plane("none", "cpu", 1), "none");
  EXPECT_THROW(resolve_device_kv_plane("socket", "cuda:1", 1), Error);
}

TEST_F(ServeConfigTest, DefaultsOnCudaSizeThePoolFromTheGpuUnlessASizeIsGiven) {
  const ResolvedServe on_gpu = checked({"--device", "cuda"});
  EXPECT_EQ(on_gpu.engine.block_size, 16);
  EXPECT_EQ(on_gpu.gpu_memory_fraction, kDefaultGpuMemoryFraction);
  EXPECT_TRUE(effective_config(on_gpu, 4096)["kv_cache_bytes"].is_null());  // sized at start

  const ResolvedServe sized = checked({"--device", "cuda:1", "--kv-cache-bytes", "2G"});
  EXPECT_EQ(sized.gpu_memory_fraction, 0.0);
  EXPECT_EQ(sized.engine.kv_cache_bytes, int64_t{2} << 30);
  EXPECT_EQ(sized.engine.block_size, 16);

  EXPECT_EQ(checked({"--device", "cuda", "--gpu-memory-utilization", "0.5"}).gpu_memory_fraction, 0.5);
  // A share given wins over a size (--gpu-memory-fraction's help says so).
  const ResolvedServe both = checked({"--device", "cuda", "--gpu-memory-fraction", "0.7", "--kv-cache-bytes", "2G"});
  EXPECT_EQ(both.gpu_memory_fraction, 0.7);
  EXPECT_TRUE(effective_config(both, 4096)["kv_cache_bytes"].is_null());
  EXPECT_EQ(checked({"--device", "cuda", "--block-size", "8"}).engine.block_size, 8);
  EXPECT_FALSE(checked({"--device", "cuda", "--enforce-eager"}).device.cuda_graphs);
  // --disable-custom-all-reduce (vLLM's flag): every tensor-parallel sum on NCCL.
  const ResolvedServe nccl_only = checked({"--device", "cuda", "--tensor-parallel-size", "2", "--disable-custom-all-reduce"});
  EXPECT_FALSE(nccl_only.device.custom_all_reduce);
  EXPECT_EQ(effective_config(nccl_only, 4096)["custom_all_reduce"], false);
  // --quantization fp8 (vLLM's flag) reaches the CUDA backend and the effective configuration.
  const ResolvedServe fp8 = checked({"--device", "cuda", "--quantization", "fp8"});
  EXPECT_TRUE(fp8.device.fp8_weights);
  EXPECT_EQ(effective_config(fp8, 4096)["quantization"], "fp8");
  EXPECT_TRUE(effective_config(on_gpu, 4096)["quantization"].is_null());
  EXPECT_FALSE(on_gpu.device.fp8_weights);
}

TEST_F(ServeConfigTest, QuantizationIsFp8OnCudaOnly) {
  expect_invalid({"--quantization", "fp8"}, {"--quantization fp8 on --device cpu", "--device cuda"});
  expect_invalid({"--device", "cuda", "--quantization", "awq"}, {"--quantization awq", "fp8"});
}

// --kv-cache-dtype (vLLM's flag): auto is the backend's own dtype; fp8 reaches the
// CUDA backend and the engine (whose capability check refuses it on a backend
// without an FP8 KV cache); the CPU refuses it here, as it refuses --quantization fp8.
TEST_F(ServeConfigTest, KvCacheDtypeIsFp8OnCudaOnly) {
  expect_invalid({"--kv-cache-dtype", "fp8"}, {"--kv-cache-dtype fp8 on --device cpu", "--device cuda"});
  expect_invalid({"--kv-cache-dtype", "fp8_e4m3"}, {"--kv-cache-dtype fp8_e4m3 on --device cpu", "--device cuda"});
  expect_invalid({"--kv-cache-dtype", "bf16"}, {"--kv-cache-dtype bf16 on --device cpu", "float32"});
  expect_invalid({"--device", "cuda", "--kv-cache-dtype", "fp8_e5m2"}, {"--kv-cache-dtype fp8_e5m2", "e4m3"});
  expect_invalid({"--device", "cuda", "--kv-cache-dtype", "int8"}, {"--kv-cache-dtype int8", "auto"});

  const ResolvedServe cpu = checked({"--kv-cache-dtype", "auto"});
  EXPECT_EQ(cpu.engine.kv_cache_dtype, KvCacheDtype::kAuto);
  EXPECT_EQ(effective_config(cpu, 4096)["kv_cache_dtype"], "float32");
  for (const char* spelling : {"fp8", "fp8_e4m3"}) {
    const ResolvedServe fp8 = checked({"--device", "cuda", "--kv-cache-dtype", spelling});
    EXPECT_EQ(fp8.engine.kv_cache_dtype, KvCacheDtype::kFp8E4M3) << spelling;
    EXPECT_EQ(fp8.device.kv_cache_dtype, KvCacheDtype::kFp8E4M3) << spelling;
    EXPECT_EQ(effective_config(fp8, 4096)["kv_cache_dtype"], "fp8_e4m3") << spelling;
  }
  for (const char* spelling : {"auto", "bf16", "bfloat16"}) {
    const ResolvedServe native = checked({"--device", "cuda", "--kv-cache-dtype", spelling});
    EXPECT_EQ(native.engine.kv_cache_dtype, KvCacheDtype::kAuto) << spelling;
    EXPECT_EQ(effective_config(native, 4096)["kv_cache_dtype"], "bfloat16") << spelling;
  }
  // The CPU backend refuses it at start too (a DeviceOptions built by other callers).
  DeviceOptions device;
  device.kv_cache_dtype = KvCacheDtype::kFp8E4M3;
  test::expect_error([&] { load_model_on_device("random:llama-tiny", device); }, ErrorKind::kInvalidArgument,
                     {"--kv-cache-dtype fp8 on --device cpu", "--device cuda"});
}

// An FP8 checkpoint is not quantized again: --quantization fp8 is refused with it, as vLLM refuses a method
// other than the checkpoint's.
TEST_F(ServeConfigTest, QuantizationFp8IsRefusedWithAnFp8Checkpoint) {
  LoadedModel model;
  model.path = "/models/llama-fp8";
  model.config.quantization.method = QuantizationMethod::kFbgemmFp8;
  model.weights = std::make_shared<const ModelWeights>();
  DeviceOptions device;
  device.fp8_weights = true;
  test::expect_error([&] { make_backend_for_device(model, device); }, ErrorKind::kInvalidArgument,
                     {"--quantization fp8", "/models/llama-fp8", "fbgemm_fp8", "already"});
}

TEST_F(ServeConfigTest, VllmSpellingsSetTheSameFieldsAsLooms) {
  const json loom = effective({"--max-running-requests", "7", "--max-batch-tokens", "512", "--max-context-tokens",
                               "1024", "--max-loras-per-batch", "3", "--lora", "a=/adapters/a", "--lora",
                               "b=/adapters/b", "--gpu-memory-fraction", "0.5", "--device", "cuda"});
  const json vllm = effective({"--max-num-seqs", "7", "--max-num-batched-tokens", "512", "--max-model-len", "1024",
                               "--max-loras", "3", "--lora-modules", "a=/adapters/a",
                               R"({"name": "b", "path": "/adapters/b"})", "--gpu-memory-utilization", "0.5",
                               "--device", "cuda", "--enable-prefix-caching", "--enable-lora", "--trust-remote-code",
                               "--dtype", "bfloat16", "--tensor-parallel-size", "1", "--kv-cache-dtype", "auto"});
  EXPECT_EQ(loom, vllm);
  const ResolvedServe serve = resolved({"--max-num-seqs", "7", "--max-model-len", "1024", "--max-loras", "3"});
  EXPECT_EQ(serve.engine.max_running_requests, 7);
  EXPECT_EQ(serve.engine.max_context_tokens, 1024);
  EXPECT_EQ(serve.engine.max_loras_per_batch, 3);

  const ResolvedServe quiet = checked({"--seed", "9", "--disable-log-requests", "--disable-log-stats",
                                       "--kv-events-config", R"({"enable_kv_cache_events": true})"});
  EXPECT_EQ(quiet.server.seed, 9u);
  EXPECT_FALSE(quiet.server.log_requests);
  EXPECT_EQ(quiet.log_stats_interval_seconds, 0.0);
  EXPECT_TRUE(quiet.engine.kv_events.enabled);
  EXPECT_EQ(quiet.engine.kv_events.endpoint, "tcp://*:5557");
  EXPECT_EQ(checked({"--log-stats-interval", "3"}).log_stats_interval_seconds, 3.0);
}

TEST_F(ServeConfigTest, EveryByteSizeFlagTakesSuffixes) {
  const ResolvedServe serve = checked(
      {"--kv-cache-bytes", "64M", "--host-kv-memory", "4M", "--host-residual-kv-memory", "1M",
       "--residual-kv-cache-memory", "2MiB", "--disk-kv-path", "/tmp/loom-serve-config-disk", "--disk-kv-bytes", "2G",
       "--disk-kv-read-bandwidth", "100M", "--prefetch-max-bytes", "512K", "--role", "decode", "--kv-buffer-bytes",
       "8M", "--max-request-bytes", "1M"});
  EXPECT_EQ(serve.engine.kv_cache_bytes, 64 << 20);
  EXPECT_EQ(serve.engine.host_kv_cache_bytes, 4 << 20);
  EXPECT_EQ(serve.engine.host_residual_kv_cache_bytes, 1 << 20);
  EXPECT_EQ(serve.engine.residual_kv_cache_bytes, 2 << 20);
  EXPECT_EQ(serve.engine.disk_kv_bytes, int64_t{2} << 30);
  EXPECT_EQ(serve.engine.disk_kv_read_bandwidth, 100 << 20);
  EXPECT_EQ(serve.engine.prefetch_max_bytes, 512 << 10);
  EXPECT_EQ(serve.kv_transfer.buffer_bytes, 8 << 20);
  EXPECT_EQ(serve.server.http.max_request_bytes, 1u << 20);
  EXPECT_EQ(effective_config(serve, 4096)["kv_buffer_bytes"], 8 << 20);
  EXPECT_EQ(checked({"--kv-transfer-port", "0"}).kv_transfer.buffer_bytes, int64_t{1} << 30);  // 1G by default
  EXPECT_EQ(checked({"--kv-cache-bytes", "4096"}).engine.kv_cache_bytes, 4096);

  // auto (the default) is -1 where a flag takes it; 0 stays 0.
  const ResolvedServe automatic = checked({"--residual-kv-cache-memory", "auto", "--host-residual-kv-memory", "0"});
  EXPECT_EQ(automatic.engine.residual_kv_cache_bytes, -1);
  EXPECT_EQ(automatic.engine.host_residual_kv_cache_bytes, 0);

  // A bad size fails the parse naming its flag (exit status 2, as every serve error).
  for (const std::string flag : {"--kv-cache-bytes", "--host-kv-memory", "--host-residual-kv-memory",
                                 "--residual-kv-cache-memory", "--disk-kv-bytes", "--disk-kv-read-bandwidth",
                                 "--prefetch-max-bytes", "--kv-buffer-bytes"}) {
    SCOPED_TRACE(flag);
    test::expect_error([&] { parse({flag, "1Q"}); }, ErrorKind::kInvalidArgument, {"bad " + flag + " '1Q'", "512K"});
  }
  for (const std::string flag : {"--kv-cache-bytes", "--host-kv-memory", "--disk-kv-bytes", "--kv-buffer-bytes"})
    test::expect_error([&] { parse({flag, "auto"}); }, ErrorKind::kInvalidArgument, {"bad " + flag + " 'auto'"});
}

TEST_F(ServeConfigTest, ResponsesStoreFlagsBoundTheStore) {
  const ResolvedServe defaults = checked({});
  EXPECT_EQ(defaults.server.responses_store.max_entries, 1024);
  EXPECT_EQ(defaults.server.responses_store.max_bytes, int64_t{256} << 20);
  EXPECT_EQ(defaults.server.responses_store.ttl_seconds, 3600.0);
  const ResolvedServe serve = checked({"--responses-store-max-entries", "3", "--responses-store-max-bytes", "64K",
                                       "--responses-store-ttl", "0"});
  EXPECT_EQ(serve.server.responses_store.max_entries, 3);
  EXPECT_EQ(serve.server.responses_store.max_bytes, 64 << 10);
  EXPECT_EQ(serve.server.responses_store.ttl_seconds, 0.0);
  EXPECT_EQ(effective_config(serve, 4096)["responses_store"]["max_bytes"], 64 << 10);
  test::expect_error([&] { parse({"--responses-store-max-bytes", "1Q"}); }, ErrorKind::kInvalidArgument,
                     {"bad --responses-store-max-bytes '1Q'"});
  EXPECT_THROW(parse({"--responses-store-max-entries", "-1"}), CLI::ParseError);
  EXPECT_THROW(parse({"--responses-store-ttl", "-5"}), CLI::ParseError);
}

TEST_F(ServeConfigTest, HostLoadPolicyPicksTheSchedulersBehaviourForLoads) {
  const ResolvedServe blocking = checked({"--host-kv-memory", "4M", "--host-load-policy", "blocking"});
  EXPECT_TRUE(blocking.engine.blocking_host_loads);
  EXPECT_EQ(effective_config(blocking, 4096)["host_load_policy"], "blocking");
  const ResolvedServe background = checked({"--host-kv-memory", "4M", "--host-load-policy", "background"});
  EXPECT_FALSE(background.engine.blocking_host_loads);
  EXPECT_EQ(effective_config(background, 4096)["host_load_policy"], "background");
  EXPECT_THROW(parse({"--host-load-policy", "wait_complete"}), CLI::ParseError);
}

TEST_F(ServeConfigTest, PreemptionModeSwapNeedsAHostTier) {
  const ResolvedServe swap = checked({"--host-kv-memory", "4M", "--preemption-mode", "swap"});
  EXPECT_TRUE(swap.engine.swap_preemption);
  EXPECT_EQ(effective_config(swap, 4096)["preemption_mode"], "swap");
  const ResolvedServe recompute = checked({"--preemption-mode", "recompute"});
  EXPECT_FALSE(recompute.engine.swap_preemption);
  EXPECT_EQ(effective_config(recompute, 4096)["preemption_mode"], "recompute");
  test::expect_error([&] { checked({"--preemption-mode", "swap"}); }, ErrorKind::kInvalidArgument,
                     {"--preemption-mode swap needs a host KV tier", "--host-kv-memory"});
  EXPECT_THROW(parse({"--preemption-mode", "offload"}), CLI::ParseError);
}

TEST_F(ServeConfigTest, ServedNamesAreOneListDefaultingToTheFileName) {
  EXPECT_EQ(checked({"--served-model-name", "one", "two"}).server.served_model_names,
            (std::vector<std::string>{"one", "two"}));
  EXPECT_EQ(effective({"--served-model-name", "one", "two"})["served_model_names"], json({"one", "two"}));
  // A file's stem, a directory's name (no file is read for either here).
  ServeOptions& file = parse({});
  file.model = "/nonexistent/SmolLM2-135M-Instruct.Q4_1.gguf";
  EXPECT_EQ(resolve(file).server.served_model_names, std::vector<std::string>{"SmolLM2-135M-Instruct.Q4_1"});
  ServeOptions& directory = parse({});
  directory.model = "/nonexistent/models/tiny/";
  EXPECT_EQ(resolve(directory).server.served_model_names, std::vector<std::string>{"tiny"});
  EXPECT_EQ(resolve(directory).server.model_path, "/nonexistent/models/tiny/");
}

TEST_F(ServeConfigTest, AdaptersKeepTheirOrderAndModes) {
  const ResolvedServe serve = checked({"--lora", "a=/adapters/a:forked", "--lora-modules", "b=/adapters/b",
                                       "--lora", "c=/adapters/c"});
  ASSERT_EQ(serve.adapters.size(), 3u);
  EXPECT_EQ(serve.adapters[0].name, "a");
  EXPECT_EQ(serve.adapters[0].sharing, KvSharing::kForked);
  EXPECT_EQ(serve.adapters[1].name, "c");  // --lora first, then --lora-modules
  EXPECT_EQ(serve.adapters[2].name, "b");
  const json config = effective_config(serve, 4096);
  EXPECT_EQ(config["adapters"][0], json({{"name", "a"}, {"path", "/adapters/a"}, {"mode", "forked"}}));
  EXPECT_EQ(config["adapters"][1]["mode"], nullptr);
}

TEST_F(ServeConfigTest, ResolveRefusesValuesItCannotRead) {
  const auto expect_resolve_error = [&](const std::vector<std::string>& args,
                                        std::initializer_list<std::string> needles) {
    SCOPED_TRACE(::testing::PrintToString(args));
    test::expect_error([&] { resolved(args); }, ErrorKind::kInvalidArgument, needles);
  };
  expect_resolve_error({"--lora", "nameonly"}, {"--lora", "NAME=PATH"});
  expect_resolve_error({"--lora", "x=/adapters/x:sometimes"}, {"sometimes", "MODE"});
  expect_resolve_error({"--lora-modules", R"({"name": "x"})"}, {"--lora-modules"});
  expect_resolve_error({"--kv-events-config", "not json"}, {"--kv-events-config"});
  expect_resolve_error({"--generation-config", "/nonexistent-loom-dir"}, {"--generation-config", "not a directory"});
  ServeOptions& options = parse({});
  options.default_sharing = "sometimes";  // CLI11 refuses it first; resolve() too
  test::expect_error([&] { resolve(options); }, ErrorKind::kInvalidArgument, {"--default-sharing sometimes"});
  test::expect_error([&] { resolved({"--chat-template", "/nonexistent/template.jinja"}); }, ErrorKind::kNotFound,
                     {"--chat-template"});
}

TEST_F(ServeConfigTest, GenerationConfigGivesTheSamplingDefaults) {
  test::TempDir directory;
  std::ofstream(directory.path() / "generation_config.json") << R"({"temperature": 0.25, "top_k": 7})";
  const json from_dir = effective({"--generation-config", directory.str()});
  EXPECT_EQ(from_dir["sampling_defaults"]["temperature"], 0.25);
  EXPECT_EQ(from_dir["sampling_defaults"]["top_k"], 7);
  EXPECT_FALSE(from_dir["generation_config"].is_null());
  const json openai = effective({"--generation-config", "vllm"});
  EXPECT_EQ(openai["generation_config"], nullptr);
  EXPECT_EQ(openai["sampling_defaults"]["temperature"], 1.0);
}

TEST_F(ServeConfigTest, ValidateChecksEveryRuleNamingTheFlags) {
  // vLLM flags (check_vllm_flags).
  expect_invalid({"--swap-space", "4"}, {"--swap-space", "--host-kv-memory"});
  expect_invalid({"--pipeline-parallel-size", "2"}, {"--tensor-parallel-size"});
  expect_invalid({"--dtype", "float16"}, {"--dtype float16"});
  expect_invalid({"--device", "cuda", "--dtype", "float32"}, {"--dtype float32", "bfloat16"});
  expect_invalid({"--kv-cache-dtype", "fp8"}, {"--kv-cache-dtype"});
  expect_invalid({"--no-enable-prefix-caching"}, {"--no-enable-prefix-caching"});
  // The pool's size.
  expect_invalid({"--kv-cache-bytes", "0"}, {"--kv-cache-bytes 0", "above 0"});
  // The disk tier: a host tier to stage its blocks, and a size cap.
  expect_invalid({"--disk-kv-path", "/tmp/loom-serve-config-disk", "--disk-kv-bytes", "1G"},
                 {"--disk-kv-path", "host KV tier", "--host-kv-memory"});
  expect_invalid({"--disk-kv-path", "/tmp/loom-serve-config-disk", "--host-kv-memory", "1M"},
                 {"--disk-kv-path", "size cap", "--disk-kv-bytes"});
  expect_invalid({"--disk-kv-path", "/tmp/loom-serve-config-disk", "--role", "prefill"}, {"--disk-kv-bytes"});
  // GPU memory shares only on a GPU.
  expect_invalid({"--gpu-memory-fraction", "0.5"}, {"--gpu-memory-fraction", "--device cpu", "--kv-cache-bytes"});
  expect_invalid({"--gpu-memory-utilization", "0.9"}, {"--gpu-memory-utilization 0.9", "--device cpu"});
  // Names: served names and adapter names all distinct (the default served name too).
  expect_invalid({"--served-model-name", "base", "--lora", "base=/adapters/a"},
                 {"'base' is given twice", "--served-model-name base", "--lora base=/adapters/a"});
  expect_invalid({"--lora", "x=/adapters/a", "--lora-modules", "x=/adapters/b"},
                 {"'x' is given twice", "--lora x=/adapters/a", "--lora x=/adapters/b"});
  expect_invalid({"--served-model-name", "a", "b", "a"}, {"'a' is given twice"});
  expect_invalid({"--lora", std::string(kModel) + "=/adapters/a"}, {"given twice", "--served-model-name"});
  // A chat template that does not parse.
  expect_invalid({"--chat-template", "{% if %}"}, {"--chat-template"});

  // Their good sides pass.
  EXPECT_NO_THROW(checked({"--kv-cache-bytes", "1"}));
  EXPECT_NO_THROW(checked({"--disk-kv-path", "/tmp/loom-serve-config-disk", "--host-kv-memory", "1M",
                           "--disk-kv-bytes", "1G"}));
  // A KV buffer brings its own host tier (kv_transfer_setup.h).
  EXPECT_NO_THROW(checked({"--disk-kv-path", "/tmp/loom-serve-config-disk", "--role", "prefill", "--disk-kv-bytes",
                           "1G"}));
  EXPECT_NO_THROW(checked({"--disk-kv-path", "/tmp/loom-serve-config-disk", "--kv-transfer-port", "0",
                           "--disk-kv-bytes", "1G"}));
  EXPECT_NO_THROW(checked({"--device", "cuda", "--gpu-memory-fraction", "0.5", "--dtype", "bf16"}));
  EXPECT_NO_THROW(checked({"--served-model-name", "base", "alias", "--lora", "a=/adapters/a"}));
  EXPECT_NO_THROW(checked({"--chat-template", "{{ messages[0]['content'] }}"}));
  EXPECT_EQ(effective({"--chat-template", "{{ messages[0]['content'] }}"})["chat_template"], "--chat-template");
}

TEST_F(ServeConfigTest, ContextLimitIsTheModelsUnlessASmallerOneIsGiven) {
  ModelConfig model;
  model.max_position_embeddings = 4096;
  EXPECT_EQ(check_context_limit(resolved({}).engine, model), 4096);
  EXPECT_EQ(check_context_limit(resolved({"--max-context-tokens", "1024"}).engine, model), 1024);
  EXPECT_EQ(check_context_limit(resolved({"--max-model-len", "4096"}).engine, model), 4096);
  test::expect_error([&] { check_context_limit(resolved({"--max-model-len", "100000"}).engine, model); },
                     ErrorKind::kInvalidArgument, {"100000", "--max-context-tokens / --max-model-len", "4096"});
}

TEST_F(ServeConfigTest, TheKvTransferSecretComesFromAFileOrTheCommandLine) {
  test::TempDir directory;
  const std::string path = directory.str() + "/kv.secret";
  {
    std::ofstream file(path);
    file << "0123456789abcdef0123456789abcdef\n";
  }
  const ResolvedServe from_file = checked({"--role", "prefill", "--kv-transfer-secret-file", path, "--host", "0.0.0.0",
                                           "--kv-transfer-peers", "10.0.0.2:7000,pe-2:*"});
  EXPECT_EQ(from_file.kv_transfer.secret, "0123456789abcdef0123456789abcdef");  // without its newline
  EXPECT_EQ(from_file.kv_transfer.host, "127.0.0.1");
  const json config = effective_config(from_file, 4096);
  EXPECT_EQ(config["kv_transfer_secret"], true);  // never the secret itself
  EXPECT_EQ(config.dump().find("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(config["kv_transfer_peers"], "10.0.0.2:7000,pe-2:*");
  EXPECT_EQ(checked({"--kv-transfer-secret", "given-on-the-command-line"}).kv_transfer.secret,
            "given-on-the-command-line");
  expect_invalid({"--kv-transfer-secret", "x", "--kv-transfer-secret-file", path}, {"both given"});
  expect_invalid({"--kv-transfer-secret", "short"}, {"5 characters, under 16", "openssl rand"});
  expect_invalid({"--kv-transfer-peers", "10.0.0.2"}, {"--kv-transfer-peers: '10.0.0.2' is not HOST:PORT"});
  test::expect_error([&] { checked({"--kv-transfer-secret-file", directory.str() + "/none"}); }, ErrorKind::kNotFound,
                     {"cannot read it"});
}

}  // namespace
}  // namespace loom::cli
