// Coalescing a layer's blocks into few large copies: pairs (source block,
// destination block) become maximal runs where both ids go up by one, so a
// plane issues one copy (one cudaMemcpyAsync, one RDMA write) per run and
// array instead of one per block. Pools handed out in order (a fresh DE
// reservation, a PE prefill's new blocks) give one run per layer and array.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace loom {

struct DeviceKvBlockRun {
  int32_t source = 0, destination = 0, count = 0;
  bool operator==(const DeviceKvBlockRun&) const = default;
};

// Precondition: sources.size() == destinations.size().
std::vector<DeviceKvBlockRun> coalesce_block_runs(std::span<const int32_t> sources,
                                                  std::span<const int32_t> destinations);

}  // namespace loom
