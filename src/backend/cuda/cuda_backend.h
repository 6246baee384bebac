// The CUDA backend (Hopper, sm_90a): bf16 weights and KV pools in GPU memory,
// tensor-core paged attention, cuBLAS GEMMs, batched multi-LoRA. Numerically it
// follows the CPU backend (backend/cpu/cpu_backend.h), the reference it is
// tested against, within bf16 tolerances.
//
// KV pools: per layer a K and a V pool of num_blocks x block_size slots of
// num_kv_heads x head_dim bf16, addressed through block tables as backend.h
// says, stored head-major within each block (plan_types.h, kv_element_index),
// allocated by allocate_kv_cache in one cudaMalloc. KV sharing: num_kv_present_tokens is
// honoured (those entries are read, never written); every sharing mode runs
// (base: ICaRus decoder rows; forked: the rCache pool and ResidualAttention).
// Decode steps replay CUDA graphs unless CudaTuning::cuda_graphs is false.
//
// Thread: the engine thread only. forward() blocks until the logits are on the host.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "model/config.h"
#include "model/tensor_parallel.h"
#include "model/weights.h"

namespace loom {

// The switches serving uses, fixed at construction (the measured effect of each
// is in bench/README.md, "GPU speed").
struct CudaTuning {
  // Decode steps of up to max_graph_rows rows (tokens + ICaRus decoder rows)
  // replay CUDA graphs captured per launch shape; false: every step eager.
  bool cuda_graphs = true;
  // A tensor-parallel rank gathers the vocabulary slices of its logits on the
  // device (vocab_gather.h) and the group samples there (device_sampling), as one
  // GPU does. false: the group returns its slices to the host, which joins and
  // samples them (bench/README.md: host-bound at 64 streams).
  bool tensor_parallel_vocab_gather = true;
  // A tensor-parallel group's sums of up to this many bytes (decode steps, short
  // chunks) run peer_all_reduce.h's one kernel over NVLink peer access instead of
  // ncclAllReduce; 0: NCCL for every sum. Read where the group is made (NcclGroup).
  int64_t tensor_parallel_peer_all_reduce_bytes = 4 << 20;
  int max_graph_rows = 256;
  // Large non-forked prefills on the wgmma kernels (attention_wide.cu,
  // attention_pingpong.cu); false: the mma.sync kernel.
  bool wgmma_prefill = true;
  // Wide prefills on the warp-specialized kernel (attention_pingpong.cu: a
  // producer warpgroup and two consumer warpgroups taking turns at the tensor
  // cores) instead of attention_wide.cu's.
  bool pingpong_prefill = true;
  // Forked (ForkKV) prefills that fill the GPU run on the wgmma kernel too, over
  // keys and values rebuilt into a scratch buffer of up to this many KV entries
  // (8B shape: 4 KiB each, 256 MiB at the default, allocated with the rCache);
  // larger ones and 0 keep the ResidualAttention kernel.
  int32_t forked_wide_prefill_keys = 65536;
  // Steps without LoRA of up to this many rows launch their kernels as
  // programmatic dependent launches (launch.cuh: each kernel's launch, and the
  // skinny GEMMs' first weight loads, overlap the previous kernel's tail; cuBLAS
  // GEMMs stay plain launches).
  int32_t programmatic_max_rows = 2;
  // Dense GEMMs of steps of up to this many rows (0..kSkinnyGemmMaxRows) run
  // skinny_gemm.cu's kernels (SwiGLU folded into gate/up when no LoRA applies);
  // larger steps and 0 use cuBLAS.
  int32_t skinny_max_rows = 2;
  // Batched LoRA of each projection group on a second stream beside its base
  // GEMM (same input, own output, joined before the consumer); false: after the
  // GEMM on the main stream.
  bool lora_side_stream = true;
  // Captured (decode) steps of up to max_rows rows read weights ahead into L2
  // on a side stream while the latency-bound kernels run: after q/k/v's GEMM,
  // o_proj's weight and the first gate_up bytes (half gate rows, half up rows);
  // after down's GEMM, the next q/k/v weight's first bytes (the lm_head's after
  // the last layer). Each figure caps the bytes at its point; 0 turns it off.
  struct L2Prefetch {
    int64_t o_proj = 16 << 20, gate_up = 8 << 20, qkv = 8 << 20;
    int32_t max_rows = 2;
  };
  L2Prefetch l2_prefetch;
};

namespace cuda {
class DeviceCommunicator;
}

// A tensor-parallel rank's place in its group (tensor_parallel_cuda_backend.h);
// the default is a backend alone. A rank runs rank_config(model, shard) over
// its shard of the weights, sums its partial products with the communicator
// after o_proj, down_proj and the embedding, checks token ids against the whole
// model's vocabulary and returns its slice of the logits.
struct CudaRank {
  TensorParallelShard shard;                         // size 1: the whole model
  cuda::DeviceCommunicator* communicator = nullptr;  // not owned, outlives the backend; null alone
  int32_t model_vocab_size = 0;                      // 0: the config's
};

struct CudaBackendConfig {
  int device = 0;
  int max_adapter_slots = 64;
  CudaTuning tuning;
  CudaRank rank;
  // --quantization fp8: q/k/v, o, gate/up and down in e4m3 with one scale per
  // matrix, quantized on the device after loading (DeviceModel::convert_to_fp8);
  // decode steps of up to 4 rows read them with bf16 activations (the FP8
  // skinny GEMM), larger steps dequantize each matrix to bf16 before its GEMM
  // (W8A16). LoRA, embeddings, lm_head and the KV cache stay bf16. No L2 prefetch.
  bool fp8_weights = false;
  // --kv-cache-dtype fp8: the main KV pool in e4m3 (kv_fp8.cuh), scales 1.0; every
  // attention kernel decodes it as it loads its tiles. The rCache stays bf16.
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;
};

// Uploads `weights` in their stored format (fp32 tensors, or 16-bit and GGUF
// block rows kept in the file mapping: LoadOptions::keep_quantized), streamed
// through a few pinned staging buffers and converted to bf16 on the device
// (weight_upload.h). The host weights are not kept. Throws Error(kUnsupported) without a usable GPU
// or for a head_dim the attention kernels lack (16, 32, 64, 128 are built).
std::unique_ptr<Backend> make_cuda_backend(const ModelConfig& config, const ModelWeights& weights,
                                           const CudaBackendConfig& backend_config = {});

// Builds `config`'s synthetic model (synthetic/synthetic_model.h) on the device with
// `loom make-model`'s per-tensor seeds: bf16 weights equal to make-model's
// bf16 file (and to its f32 file rounded to bf16). round_to_bf16 also rounds
// norms and biases through bf16, as the 8b preset's bf16 file stores them.
std::unique_ptr<Backend> make_synthetic_cuda_backend(const ModelConfig& config, uint64_t seed, bool round_to_bf16,
                                                     const CudaBackendConfig& backend_config = {});

// What the CUDA backend runs (backend_capabilities.h), without a GPU: every KV
// sharing mode (forked: k/v ranks up to 64), head dims 16/32/64/128, hidden /
// intermediate / q sizes in multiples of 8, LoRA ranks up to 256, device
// sampling, host tiers for the main pool and the rCache, capture_hidden_states.
BackendCapabilities cuda_backend_capabilities();

// "NVIDIA H100 80GB HBM3 (132 SMs, 79.1 GiB)"; throws Error(kUnsupported) without a GPU.
std::string cuda_device_description(int device = 0);
// Free / total device memory in bytes right now (for sizing the KV pool).
int64_t cuda_free_memory_bytes(int device = 0);
int64_t cuda_total_memory_bytes(int device = 0);

}  // namespace loom
