// Tensor parallelism on CUDA (docs/tensor-parallel.md): N CudaBackend ranks,
// rank r on devices[r] over its shard of the model, joined by one
// DeviceCommunicator each, run by TensorParallelBackend (a thread per rank;
// logits gathered on the host). Its host KV tier is one pinned arena per pool
// whose host block holds every rank's part (as the CPU group's), so the disk
// tier and the KV link see whole blocks. A rank whose communicator cannot be
// captured runs its steps eagerly.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/tensor_parallel_backend.h"

namespace loom::cuda {

// `config` and `weights` are the whole model's (fp32, or 16-bit rows kept in
// their file: each rank's shard views them, and its upload reads only its
// rows and columns); backend_config's device and rank are set per rank. The
// communicators must outlive the backend (group.owner may own them).
std::unique_ptr<Backend> make_tensor_parallel_cuda_backend(const ModelConfig& config, const ModelWeights& weights,
                                                           const CudaBackendConfig& backend_config,
                                                           std::span<const int> devices,
                                                           std::span<DeviceCommunicator* const> communicators,
                                                           TensorParallelGroup group);

// `--model random:...` under tensor parallelism: `config` is the whole model's,
// and each rank draws only its slices of make-model's tensors on its own GPU
// (DeviceModel::synthetic with a shard), so no host copy of the model exists:
// the same values as sharding make-model's checkpoint of `seed`.
std::unique_ptr<Backend> make_synthetic_tensor_parallel_cuda_backend(
    const ModelConfig& config, uint64_t seed, bool round_to_bf16, const CudaBackendConfig& backend_config,
    std::span<const int> devices, std::span<DeviceCommunicator* const> communicators, TensorParallelGroup group);

}  // namespace loom::cuda
