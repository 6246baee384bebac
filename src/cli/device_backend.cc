#include "cli/device_backend.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include "backend/cpu/cpu_backend.h"
#include "cli/commands.h"
#include "synthetic/synthetic_model.h"
#include "synthetic/synthetic_tokenizer.h"
#include "synthetic/synthetic_weights.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#ifdef LOOM_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/nccl_group.h"
#include "backend/cuda/tensor_parallel_cuda_backend.h"
#endif

namespace loom::cli {

namespace {

constexpr const char* kRandomPrefix = "random:";

struct RandomSpec {
  Architecture arch = Architecture::kLlama;
  SyntheticPreset preset = SyntheticPreset::kTiny;
  uint64_t seed = 0;
};

RandomSpec parse_random_spec(const std::string& flag) {
  std::string text = flag.substr(std::string(kRandomPrefix).size());
  RandomSpec spec;
  const size_t colon = text.find(':');
  if (colon != std::string::npos) {
    try {
      spec.seed = std::stoull(text.substr(colon + 1));
    } catch (const std::exception&) {
      fail(ErrorKind::kInvalidArgument, "--model {}: seed '{}' is not a number", flag, text.substr(colon + 1));
    }
    text = text.substr(0, colon);
  }
  const size_t dash = text.find('-');
  if (dash != std::string::npos) {
    spec.arch = architecture_from_short_name(text.substr(0, dash));
    text = text.substr(dash + 1);
  }
  spec.preset = synthetic_preset_from_name(text);
  return spec;
}

}  // namespace

int cuda_device_index(const std::string& device) {
  if (device == "cuda") return 0;
  try {
    return std::stoi(device.substr(5));
  } catch (const std::exception&) {
    fail(ErrorKind::kInvalidArgument, "--device {}: expected cpu, cuda or cuda:N", device);
  }
}

bool cpu_precision_keeps_quantized(const std::string& precision) {
  if (precision != "auto" && precision != "fp32")
    fail(ErrorKind::kInvalidArgument, "--cpu-precision {}: expected fp32 or auto", precision);
  return precision == "auto";
}

bool is_cuda(const std::string& device) { return device == "cuda" || device.rfind("cuda:", 0) == 0; }

int32_t default_block_size(const std::string& device) { return is_cuda(device) ? 16 : 4; }

namespace {

void check_device_name(const std::string& device) {
  if (device != "cpu" && !is_cuda(device))
    fail(ErrorKind::kInvalidArgument, "--device {}: expected cpu, cuda or cuda:N", device);
#ifndef LOOM_HAVE_CUDA
  if (is_cuda(device))
    throw Error(ErrorKind::kUnsupported, "--device " + device + ": this build has no CUDA backend",
                "rebuild with -DLOOM_CUDA=ON on a machine with the CUDA toolkit");
#endif
}

// The synthetic tokenizer `loom make-model` writes for this arch, loaded through a temporary directory.
std::shared_ptr<const Tokenizer> synthetic_tokenizer(const ModelConfig& config) {
  PreTokenizerFamily family = PreTokenizerFamily::kSmolLM;
  if (config.arch == Architecture::kLlama) family = PreTokenizerFamily::kLlama3;
  if (config.arch == Architecture::kQwen2 || config.arch == Architecture::kQwen3) family = PreTokenizerFamily::kQwen2;
  const SyntheticTokenizer tokenizer = make_synthetic_tokenizer(config.vocab_size, family);
  const std::filesystem::path directory =
      std::filesystem::temp_directory_path() / ("loom-random-tokenizer-" + std::to_string(::getpid()));
  std::filesystem::create_directories(directory);
  std::ofstream(directory / "tokenizer.json", std::ios::trunc) << tokenizer.tokenizer_json;
  std::ofstream(directory / "tokenizer_config.json", std::ios::trunc) << tokenizer.tokenizer_config_json;
  std::shared_ptr<const Tokenizer> loaded = Tokenizer::from_hf_directory(directory.string());
  std::error_code ignored;
  std::filesystem::remove_all(directory, ignored);
  return loaded;
}

#ifdef LOOM_HAVE_CUDA
CudaBackendConfig cuda_backend_config(const DeviceOptions& options) {
  CudaBackendConfig config;
  config.device = cuda_device_index(options.device);
  config.max_adapter_slots = options.max_adapter_slots;
  config.tuning.cuda_graphs = options.cuda_graphs;
  if (!options.custom_all_reduce) config.tuning.tensor_parallel_peer_all_reduce_bytes = 0;
  config.fp8_weights = options.fp8_weights;
  config.kv_cache_dtype = options.kv_cache_dtype;  // refused by the engine until the backend declares fp8_kv_cache
  return config;
}
#endif

#ifdef LOOM_HAVE_CUDA
// Rank r on GPU device + r (--device cuda:K starts at K), as vLLM takes the first N visible GPUs.
std::vector<int> tensor_parallel_devices(const CudaBackendConfig& config, const DeviceOptions& options) {
  std::vector<int> devices;
  for (int32_t r = 0; r < options.tensor_parallel_size; ++r) devices.push_back(config.device + r);
  return devices;
}
#endif

}  // namespace

std::unique_ptr<Backend> make_backend_for_device(const LoadedModel& model, const DeviceOptions& options) {
  check_device_name(options.device);
  if (model.weights == nullptr) fail(ErrorKind::kInvalidArgument, "{}: no host weights to put on a device", model.path);
  if (options.fp8_weights && model.config.quantization.fp8())  // as vLLM refuses a method other than the checkpoint's
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("--quantization fp8 with {}, an FP8 checkpoint already ({})", model.path,
                            describe(model.config.quantization)),
                "drop --quantization: the checkpoint's own scales are used");
  if (options.device == "cpu") {
    if (options.fp8_weights)
      throw Error(ErrorKind::kInvalidArgument, "--quantization fp8 on --device cpu",
                  "FP8 weights run on --device cuda (Hopper); the CPU backend runs fp32, or a GGUF file's own blocks");
    if (options.kv_cache_dtype == KvCacheDtype::kFp8E4M3)
      throw Error(ErrorKind::kInvalidArgument, "--kv-cache-dtype fp8 on --device cpu",
                  "an FP8 KV cache runs on --device cuda (Hopper); the CPU backend keeps its KV cache in float32: "
                  "give auto");
    CpuBackendConfig config;
    config.num_threads = options.threads;
    config.max_adapter_slots = options.max_adapter_slots;
    config.tensor_parallel_size = options.tensor_parallel_size;
    return make_cpu_backend(model.config, model.weights, config);
  }
#ifdef LOOM_HAVE_CUDA
  const CudaBackendConfig config = cuda_backend_config(options);
  if (options.tensor_parallel_size > 1) {
    const std::vector<int> devices = tensor_parallel_devices(config, options);
    auto group = std::make_shared<cuda::NcclGroup>(devices, config.tuning.tensor_parallel_peer_all_reduce_bytes);
    const std::vector<cuda::DeviceCommunicator*> communicators = group->communicators();
    return cuda::make_tensor_parallel_cuda_backend(model.config, *model.weights, config, devices, communicators,
                                                   cuda::nccl_tensor_parallel_group(std::move(group)));
  }
  return make_cuda_backend(model.config, *model.weights, config);
#else
  fail(ErrorKind::kInternal, "unreachable");
#endif
}

LoadedModel load_model_description(const std::string& model_flag) {
  if (model_flag.rfind(kRandomPrefix, 0) != 0) return load_model(resolve_model_path(model_flag));
  const RandomSpec spec = parse_random_spec(model_flag);
  LoadedModel model;
  model.path = model_flag;
  model.config = synthetic_model_config(spec.arch, spec.preset);
  model.tokenizer = synthetic_tokenizer(model.config);
  return model;
}

ModelOnDevice load_model_on_device(const std::string& model_flag, const DeviceOptions& options) {
  check_device_name(options.device);
  ModelOnDevice result;
  if (model_flag.rfind(kRandomPrefix, 0) != 0) {
    LoadOptions load_options;
    // cuda: the weights stay in their file format (mapped, not expanded) and are converted on the GPU;
    // cpu: as --cpu-precision says, but shards are cut from fp32 weights.
    load_options.keep_quantized =
        options.device == "cpu" ? options.cpu_keep_quantized && options.tensor_parallel_size == 1 : true;
    result.model = load_model(resolve_model_path(model_flag), load_options);
    result.backend = make_backend_for_device(result.model, options);
    return result;
  }
  const RandomSpec spec = parse_random_spec(model_flag);
  result.model = load_model_description(model_flag);
  // Drawn on the host on the CPU (tiny only); on the GPU each device draws its
  // weights itself, a tensor-parallel rank only its slices: no host copy.
  if (options.device == "cpu") {
    if (spec.preset != SyntheticPreset::kTiny)
      throw Error(ErrorKind::kUnsupported, "--model " + model_flag + " on --device cpu",
                  "use --device cuda, or write it with `loom make-model` first");
    TensorMap tensors;
    for (const SyntheticTensorSpec& tensor_spec : synthetic_base_tensor_specs(result.model.config))
      tensors[tensor_spec.name] = make_synthetic_tensor(tensor_spec, spec.seed);
    result.model.weights =
        std::make_shared<ModelWeights>(build_model_weights(result.model.config, tensors, model_flag));
    result.backend = make_backend_for_device(result.model, options);
    return result;
  }
#ifdef LOOM_HAVE_CUDA
  // make-model stores the 8b, 14b and 70b presets in bf16 (norms included) and tiny in f32.
  const bool round_to_bf16 = spec.preset != SyntheticPreset::kTiny;
  const CudaBackendConfig config = cuda_backend_config(options);
  if (options.tensor_parallel_size > 1) {
    const std::vector<int> devices = tensor_parallel_devices(config, options);
    auto group = std::make_shared<cuda::NcclGroup>(devices, config.tuning.tensor_parallel_peer_all_reduce_bytes);
    const std::vector<cuda::DeviceCommunicator*> communicators = group->communicators();
    result.backend = cuda::make_synthetic_tensor_parallel_cuda_backend(
        result.model.config, spec.seed, round_to_bf16, config, devices, communicators,
        cuda::nccl_tensor_parallel_group(std::move(group)));
    return result;
  }
  result.backend = make_synthetic_cuda_backend(result.model.config, spec.seed, round_to_bf16, config);
#endif
  return result;
}

int64_t kv_cache_bytes_for_gpu_fraction(const DeviceOptions& options, double fraction) {
  check_device_name(options.device);
  if (!is_cuda(options.device)) return 0;
  if (!(fraction > 0.0 && fraction <= 1.0))
    fail(ErrorKind::kInvalidArgument, "--gpu-memory-fraction {}: expected a value in (0, 1]", fraction);
#ifdef LOOM_HAVE_CUDA
  const int device = cuda_device_index(options.device);
  // Free memory now (weights loaded) minus the share of the card to leave free.
  const int64_t free_bytes = cuda_free_memory_bytes(device);
  const int64_t total_bytes = cuda_total_memory_bytes(device);
  const int64_t keep_free = static_cast<int64_t>((1.0 - fraction) * static_cast<double>(total_bytes));
  if (free_bytes <= keep_free)
    throw Error(ErrorKind::kCapacity,
                fmt::format("--gpu-memory-fraction {}: {:.2f} of the GPU's {:.2f} GiB are free after the weights, "
                            "and {:.2f} GiB must stay free: no room for the KV cache",
                            fraction, static_cast<double>(free_bytes) / (1 << 30),
                            static_cast<double>(total_bytes) / (1 << 30), static_cast<double>(keep_free) / (1 << 30)),
                "raise --gpu-memory-fraction (--gpu-memory-utilization), give --kv-cache-bytes, or free the GPU");
  return free_bytes - keep_free;
#else
  return 0;
#endif
}

}  // namespace loom::cli
