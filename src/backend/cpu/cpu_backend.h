// The CPU backend: fp32 everywhere, OpenBLAS GEMMs, OpenMP across heads and
// tokens. It is the numerical reference the CUDA backend is checked against.
//
// Quantized weights: a GGUF loaded with LoadOptions::keep_quantized keeps its
// matrices (and the embedding) in their block format, multiplied by the int8
// kernels of quant/quantized_matmul.h through gemm.h; an embedding row is
// dequantized when a token looks it up. LoRA, norms, KV and activations stay fp32.
// The fp32 reference is what a model loaded without keep_quantized runs.
//
// FP8 checkpoints (docs/quantization.md) are emulated: each FP8 linear weight
// is dequantized to fp32 at load (w = e4m3 x its row scale,
// dequantize_fp8_weights), so the CPU runs the checkpoint's weights exactly
// but with unquantized fp32 activations (W8A16 semantics: no dynamic or
// static activation quantization; input scales are not used). The CPU declares
// no FP8 capability (BackendCapabilities::fp8_weights, fp8_kv_cache), refuses
// --quantization fp8 and --kv-cache-dtype fp8, and keeps its KV cache in fp32.
//
// Threads: forward() runs OpenMP regions of num_threads threads on the calling
// (engine) thread. GEMMs are split across those threads with one single-threaded
// OpenBLAS call each, so make_cpu_backend sets OpenBLAS to one thread for the
// whole process (openblas_set_num_threads(1)). Decode-sized GEMMs (<= 8 rows)
// use a small AVX2 kernel instead of OpenBLAS (see skinny_gemm.h).
//
// KV sharing (backend.h): base-sharing sequences add decoder rows after the
// batch's tokens, run in the same GEMMs and beside their tokens in attention
// (paged_attention.h); forked sequences keep an fp32 rCache pool
// (allocate_residual_cache) and attend through ResidualAttention
// (residual_attention.h), which needs a model without q/k norm.
//
// Host tier (backend.h): allocate_host_kv_cache keeps a second arena per pool
// kind and copy_kv_blocks memcpys whole blocks (host_kv_pool.h), on any thread
// beside forward().
//
// Tensor parallelism (CpuBackendConfig::tensor_parallel_size): the same
// sharding the GPU ranks run, over threads and an in-process all-reduce, so CI
// checks that the shards give the whole model's logits.
//
// Speed note: OpenBLAS 0.3.21 does not know recent Xeons (e.g. Emerald Rapids)
// and falls back to SSE3 kernels; the backend logs a warning then, and
// OPENBLAS_CORETYPE=SkylakeX (or Haswell) in the environment fixes it.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "model/config.h"
#include "model/weights.h"

namespace loom {

struct CpuBackendConfig {
  int num_threads = 0;          // 0: omp_get_max_threads() (all cores, or $OMP_NUM_THREADS)
  int max_adapter_slots = 64;
  // > 1: that many ranks, each a thread with num_threads / N OpenMP threads of
  // its own, run the model sharded as model/tensor_parallel.h lays it out
  // (tensor_parallel_cpu_backend.h). fp32 weights only.
  int tensor_parallel_size = 1;
};

std::unique_ptr<Backend> make_cpu_backend(const ModelConfig& config,
                                          std::shared_ptr<const ModelWeights> weights,
                                          const CpuBackendConfig& backend_config = {});

}  // namespace loom
