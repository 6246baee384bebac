// Where a CPU forward pass spends its time, measured from outside the backend:
// the CPU backend's own kernels (backend/cpu/cpu_kernels.h, paged_attention.h)
// are called on the model's real weights with the shapes one forward() of
// `batch` uses, section by section, across all layers. Comparing their sum with
// the measured forward() time shows what is left in glue (scratch resizes,
// embedding copies, thread start-up). Kernels only; no backend state is touched.
//
// Thread: the engine thread, with no other OpenMP region running. The OpenBLAS
// thread count is whatever the backend set when it was made.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "model/loader.h"

namespace loom::bench {

struct BreakdownSection {
  std::string name;
  double seconds = 0;  // median over repeats, for one whole forward (all layers)
};

// `batch` must be valid for a KV cache of `block_size` (its block ids are used
// as given in a private pool sized from them). `num_logit_rows` rows go through
// the LM head.
std::vector<BreakdownSection> measure_forward_breakdown(const LoadedModel& model, const Batch& batch,
                                                        int num_logit_rows, int block_size,
                                                        int num_threads, int num_repeats);

}  // namespace loom::bench
