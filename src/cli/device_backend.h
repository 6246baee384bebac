// `--device` and `--model random:...` for the CLI commands: picks the backend
// (CPU, or CUDA when this build has it) and loads the model for it.
//
//   --device cpu | cuda | cuda:N
//   --model  PATH (a Hugging Face directory or .gguf, as load_model takes)
//            random:[ARCH-]PRESET[:SEED]  e.g. random:llama-8b, random:llama-70b, random:qwen3-14b, random:tiny, random:qwen3-tiny:7
//            The synthetic model of `loom make-model --arch ARCH --preset PRESET --seed SEED`
//            (ARCH default llama, SEED default 0), built directly on the GPU with
//            make-model's per-tensor seeds: no 16 GB file. Its tokenizer is the
//            synthetic one make-model writes. On --device cpu only the tiny preset.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "model/loader.h"

namespace loom::cli {

struct DeviceOptions {
  std::string device = "cpu";
  int threads = 0;              // CPU backend threads (0: all cores)
  int max_adapter_slots = 64;
  bool cuda_graphs = true;      // cuda: decode steps as CUDA graphs (--enforce-eager: false)
  // cpu: a GGUF's matrices stay in their block format (quantized kernels), a safetensors
  // checkpoint's f16/bf16 ones in 16 bits, instead of fp32.
  bool cpu_keep_quantized = false;
  // --tensor-parallel-size: ranks the model is sharded over (model/tensor_parallel.h).
  // cpu: threads of one backend, fp32 weights (cpu_keep_quantized is then ignored).
  int tensor_parallel_size = 1;
  bool fp8_weights = false;  // --quantization fp8 (cuda only: CudaBackendConfig::fp8_weights)
  // --kv-cache-dtype (cuda only for fp8; the CPU refuses it at start). The engine
  // gets it too (EngineConfig::kv_cache_dtype) and checks the backend's capability.
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;
  // cuda -tp: small sums on the peer-access kernel (--disable-custom-all-reduce: false, NCCL for all).
  bool custom_all_reduce = true;
};

// --cpu-precision fp32|auto (serve, generate): auto keeps a GGUF's weights
// quantized on the CPU, and a safetensors checkpoint's f16/bf16 matrices in
// 16 bits (the default); fp32 expands them at load (the exact reference path
// the golden tests use).
inline constexpr const char* kCpuPrecisionHelp =
    "cpu: auto keeps a GGUF's quantized weights in their format and runs int8 kernels, and a safetensors "
    "checkpoint's f16/bf16 matrices in 16 bits (less memory, faster decode); fp32 expands them to fp32 at load "
    "(the reference path)";
// True for "auto"; throws Error(kInvalidArgument) for anything but auto and fp32.
bool cpu_precision_keeps_quantized(const std::string& precision);

struct ModelOnDevice {
  LoadedModel model;            // weights are null for random models on the GPU
  std::unique_ptr<Backend> backend;
};

// `loom serve`'s KV block size when --block-size is not given: 16 on cuda, 4 on
// cpu. A warm prompt recomputes the tokens after its last whole cached block
// (1 .. block_size of them), each attending to the whole cached context; on
// the CPU that tail was most of a warm 2K prompt's time to first token (14
// tokens at block size 16: ~60 ms of 65, SmolLM2-135M, 2 threads; bench/README.md).
int32_t default_block_size(const std::string& device);

// Loads `model_flag` (after resolve_model_path for plain paths) and makes the
// backend for `options.device`. Throws Error(kUnsupported) for cuda in a build
// without it or on a machine without a GPU, Error(kInvalidArgument) for an
// unknown device or random model spec.
// --device: "cuda" or "cuda:N"; N ("cuda" is 0; throws Error(kInvalidArgument) when N is not a number).
bool is_cuda(const std::string& device);
int cuda_device_index(const std::string& device);

ModelOnDevice load_model_on_device(const std::string& model_flag, const DeviceOptions& options);

// The model's config and tokenizer, and its host weights where it has a file
// (`random:` specs: config and synthetic tokenizer only, any preset): for
// commands that need no backend (make-adapters).
LoadedModel load_model_description(const std::string& model_flag);

// The backend for an already loaded model (weights required).
std::unique_ptr<Backend> make_backend_for_device(const LoadedModel& model, const DeviceOptions& options);

// For --gpu-memory-fraction F: the KV pool bytes that leave (1 - F) of the
// GPU's memory free after the weights (already loaded) and the pool. 0 on cpu.
// Throws Error(kCapacity) when less than that share is free (no room for a pool).
int64_t kv_cache_bytes_for_gpu_fraction(const DeviceOptions& options, double fraction);

}  // namespace loom::cli
