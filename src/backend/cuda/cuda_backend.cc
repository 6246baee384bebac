#include "backend/cuda/cuda_backend_impl.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "backend/batch_checks.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_communicator.h"
#include "util/error.h"

namespace loom {

namespace cuda {

namespace {

void check_model_supported(const ModelConfig& config) {
  check_model_capabilities(cuda_backend_capabilities(), config);
}

CudaRank with_model_vocab(CudaRank rank, const ModelConfig& config) {
  if (rank.model_vocab_size == 0) rank.model_vocab_size = config.vocab_size;
  if (rank.shard.size == 1) rank.shard = tensor_parallel_shard(config, 0, 1);
  return rank;
}

int current_sm_count(int device) {
  int count = 0;
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count;
}

}  // namespace

CudaBackend::CudaBackend(const ModelConfig& config, DeviceModel model, cudaStream_t stream, int device,
                         const CudaBackendConfig& backend_config)
    : config_(config),
      layer_(layer_spec(config)),
      device_(device),
      rank_(with_model_vocab(backend_config.rank, config)),
      tuning_(backend_config.tuning),
      wide_prefill_(tuning_.wgmma_prefill && attention_wide_supports_head_dim(config.head_dim)),
      num_sms_(current_sm_count(device)),
      decode_ctas_per_sm_(attention_decode_ctas_per_sm(config.head_dim)),
      stream_(stream),
      model_(std::move(model)),
      gemm_(stream),
      pools_(config, device, wide_prefill_ ? tuning_.forked_wide_prefill_keys : 0, backend_config.kv_cache_dtype),
      lora_(config, backend_config.max_adapter_slots, tuning_.lora_side_stream),
      prefetcher_(config, tuning_.l2_prefetch),
      runner_(StepParts{config_, layer_, tuning_, model_, gemm_, pools_, lora_, plan_, buffers_, prefetcher_, rank_}),
      vocab_gather_(rank_.shard, config.vocab_size, rank_.model_vocab_size,
                    tuning_.tensor_parallel_vocab_gather ? rank_.communicator : nullptr),
      sampler_(vocab_gather_.vocab_size()) {
  pools_.set_fp8_scales(model_.k_cache_scales(), model_.v_cache_scales());
  // A group whose all-reduce cannot be captured runs every step eagerly.
  if (rank_.communicator != nullptr && !rank_.communicator->capturable()) tuning_.cuda_graphs = false;
  if (tuning_.skinny_max_rows < 0 || tuning_.skinny_max_rows > kSkinnyGemmMaxRows)
    fail(ErrorKind::kInvalidArgument, "cuda backend: skinny_max_rows {} outside [0, {}]", tuning_.skinny_max_rows,
         kSkinnyGemmMaxRows);
  spdlog::info("cuda backend: {} weights {:.2f} GiB on {}", architecture_hf_name(config_.arch),
               static_cast<double>(model_.weight_bytes()) / (1 << 30), cuda_device_description(device));
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(stream_);
  for (cudaEvent_t event : layer_events_) cudaEventDestroy(event);
  graphs_.clear();
  cudaStreamDestroy(stream_);
}

void CudaBackend::use_device() const {
  // The engine calls from its own threads; a thread's current device is 0 until it is set. Cheap
  // when already current, so set every time rather than trust a cache other code could outdate.
  LOOM_CUDA_CHECK(cudaSetDevice(device_));
}

void CudaBackend::allocate_kv_cache(const KvCacheShape& shape) {
  use_device();
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  graphs_.clear();  // they hold per-layer pool addresses and the block size
  pools_.allocate_main(shape, stream_);
}

void CudaBackend::allocate_residual_cache(const ResidualCacheShape& shape) {
  use_device();
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  graphs_.clear();
  pools_.allocate_residual(shape, stream_);
}

void CudaBackend::allocate_host_kv_cache(KvPoolKind pool, int32_t num_blocks) {
  use_device();
  pools_.allocate_host(pool, num_blocks);
}

std::span<std::byte> CudaBackend::host_kv_block(KvPoolKind pool, int32_t host_block_id) {
  return pools_.host_block(pool, host_block_id);
}

void CudaBackend::copy_kv_blocks(KvPoolKind pool, KvCopyDirection direction, std::span<const int32_t> device_block_ids,
                                 std::span<const int32_t> host_block_ids) {
  pools_.copy_blocks(pool, direction, device_block_ids, host_block_ids);
}

void CudaBackend::set_adapter(int32_t slot, std::shared_ptr<const LoraAdapter> adapter) {
  use_device();
  lora_.set_adapter(slot, std::move(adapter), stream_);
}

std::vector<CacheGauge> CudaBackend::cache_gauges() const { return {graphs_.gauge(), gemm_.cache_gauge()}; }

#ifdef LOOM_CUDA_MEASURE
void CudaBackend::set_tuning(const CudaTuning& tuning) {
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  graphs_.clear();
  // The parts were built from tuning_ (the pools' scratch, the LoRA stream, the
  // prefetch sizes): only the switches read per step may change here.
  const CudaTuning& old = tuning_;
  if (tuning.wgmma_prefill != old.wgmma_prefill || tuning.forked_wide_prefill_keys != old.forked_wide_prefill_keys ||
      tuning.lora_side_stream != old.lora_side_stream || tuning.cuda_graphs != old.cuda_graphs)
    fail(ErrorKind::kInvalidArgument, "set_tuning: wgmma_prefill, forked_wide_prefill_keys, lora_side_stream and "
                                      "cuda_graphs are fixed at construction");
  tuning_ = tuning;
}
#endif

}  // namespace cuda

namespace {

cudaStream_t make_stream(int device) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess || count == 0) {
    cudaGetLastError();
    throw Error(ErrorKind::kUnsupported,
                fmt::format("--device cuda: no CUDA GPU available ({})",
                            status != cudaSuccess ? cudaGetErrorString(status) : "0 devices"),
                "run on a machine with an NVIDIA GPU, or use --device cpu");
  }
  if (device < 0 || device >= count)
    fail(ErrorKind::kInvalidArgument, "--device cuda: GPU {} outside the {} present", device, count);
  LOOM_CUDA_CHECK(cudaSetDevice(device));
  int major = 0;
  LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major < 9)
    throw Error(ErrorKind::kUnsupported, fmt::format("--device cuda: {} is not a Hopper GPU", cuda_device_description(device)),
                "this build's kernels are compiled for sm_90a (H100/H200)");
  cudaStream_t stream = nullptr;
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return stream;
}

// FP8 weights, from an FP8 checkpoint (uploaded as they are) or --quantization
// fp8 (CudaBackendConfig::fp8_weights: converted here): the sizes the FP8 kernels need.
void prepare_fp8(const ModelConfig& config, cuda::DeviceModel& model, const CudaBackendConfig& backend_config,
                 cudaStream_t stream) {
  if (!backend_config.fp8_weights && !model.fp8()) return;
  if (config.hidden_size % 16 != 0 || config.q_size() % 16 != 0 || config.intermediate_size % 16 != 0)
    throw Error(ErrorKind::kUnsupported,
                fmt::format("FP8 weights on cuda: hidden ({}), q ({}) and intermediate ({}) sizes must be multiples of 16",
                            config.hidden_size, config.q_size(), config.intermediate_size));
  if (model.fp8()) return;
  // Per-channel weight scales where cuBLASLt's FP8 GEMM takes them (an alpha
  // vector), else one scale a matrix as vLLM's dynamic fp8 has.
  const bool per_channel = cuda::Gemm(stream).supports_fp8(128, 4096, 4096, cuda::Gemm::Output::kBF16, 4096,
                                                           cuda::Gemm::Fp8Scaling::kChannel);
  model.convert_to_fp8(config, stream, per_channel);
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const ModelConfig& config, const ModelWeights& weights,
                                           const CudaBackendConfig& backend_config) {
  validate_weights(weights, config);
  cuda::check_model_supported(config);
  cudaStream_t stream = make_stream(backend_config.device);
  try {
    cuda::DeviceModel model = cuda::DeviceModel::upload(config, weights, backend_config.device, stream);
    prepare_fp8(config, model, backend_config, stream);
    return std::make_unique<cuda::CudaBackend>(config, std::move(model), stream, backend_config.device, backend_config);
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
}

std::unique_ptr<cuda::CudaBackend> cuda::make_synthetic_cuda_backend_impl(const ModelConfig& config, uint64_t seed,
                                                                         bool round_to_bf16,
                                                                         const CudaBackendConfig& backend_config) {
  const bool sharded = backend_config.rank.shard.size > 1;
  const ModelConfig held = sharded ? rank_config(config, backend_config.rank.shard) : config;
  cuda::check_model_supported(held);
  cudaStream_t stream = make_stream(backend_config.device);
  try {
    cuda::DeviceModel model =
        cuda::DeviceModel::synthetic(config, seed, round_to_bf16, stream, sharded ? &backend_config.rank.shard : nullptr);
    prepare_fp8(held, model, backend_config, stream);
    return std::make_unique<cuda::CudaBackend>(held, std::move(model), stream, backend_config.device, backend_config);
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
}

std::unique_ptr<Backend> make_synthetic_cuda_backend(const ModelConfig& config, uint64_t seed, bool round_to_bf16,
                                                     const CudaBackendConfig& backend_config) {
  return cuda::make_synthetic_cuda_backend_impl(config, seed, round_to_bf16, backend_config);
}

BackendCapabilities cuda_backend_capabilities() {
  BackendCapabilities capabilities;
  capabilities.name = "cuda";
  capabilities.kv_sharing_modes = all_kv_sharing_modes();
  capabilities.max_residual_rank = cuda::kResidualMaxRank;
  for (int32_t head_dim = 1; head_dim <= 1024; ++head_dim)
    if (cuda::attention_supports_head_dim(head_dim)) capabilities.head_dims.push_back(head_dim);
  capabilities.dimension_multiple = 8;  // the LoRA and skinny GEMM kernels' 16-byte loads
  capabilities.max_lora_rank = cuda::kLoraMaxRank;
  capabilities.device_sampling = true;
  capabilities.host_cores_idle = true;
  capabilities.device_token_masks = true;
  capabilities.device_logit_processing = true;
  capabilities.host_kv_tier = true;
  capabilities.residual_host_kv_tier = true;
  capabilities.capture_hidden_states = true;
  capabilities.fp8_weights = true;
  capabilities.fp8_kv_cache = true;            // CudaFp8Kv.*, CudaAttention.Fp8CacheReadsAsItsDequantizedValues
  capabilities.kv_layer_notifications = true;  // CudaKvLayerListener.*
  return capabilities;
}

std::string cuda_device_description(int device) {
  cudaDeviceProp properties{};
  const cudaError_t status = cudaGetDeviceProperties(&properties, device);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorKind::kUnsupported, fmt::format("no CUDA GPU {}: {}", device, cudaGetErrorString(status)));
  }
  return fmt::format("{} ({} SMs, {:.1f} GiB, sm_{}{})", properties.name, properties.multiProcessorCount,
                     static_cast<double>(properties.totalGlobalMem) / (1 << 30), properties.major, properties.minor);
}

int64_t cuda_free_memory_bytes(int device) {
  LOOM_CUDA_CHECK(cudaSetDevice(device));
  size_t free_bytes = 0, total_bytes = 0;
  LOOM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(free_bytes);
}

int64_t cuda_total_memory_bytes(int device) {
  LOOM_CUDA_CHECK(cudaSetDevice(device));
  size_t free_bytes = 0, total_bytes = 0;
  LOOM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<int64_t>(total_bytes);
}

}  // namespace loom
