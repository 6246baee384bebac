// The CPU backend: fp32 everywhere, OpenBLAS GEMMs, OpenMP across heads and
// tokens. It is the numerical reference the CUDA backend is checked against.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "model/config.h"
#include "model/weights.h"

namespace loom {

struct CpuBackendConfig {
  int num_threads = 0;          // 0: all cores
  int max_adapter_slots = 64;
};

std::unique_ptr<Backend> make_cpu_backend(const ModelConfig& config,
                                          std::shared_ptr<const ModelWeights> weights,
                                          const CpuBackendConfig& backend_config = {});

}  // namespace loom
