// The CUDA graphs of a backend's decode steps, one per launch shape (the padded
// plan's LaunchCounts with the step's ranks). The first step of a shape runs
// eagerly and is then captured (capture runs nothing); later steps of the shape
// replay it. A graph holds the addresses of every buffer the step touches:
// when any of them moves, all graphs go (check_addresses). Beyond kCapacity the
// least recently used goes. Owns the graph executables.
//
// Thread: the engine thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include <cuda_runtime_api.h>

#include "backend/cuda/step_plan.h"
#include "util/cache_gauge.h"

namespace loom::cuda {

class GraphCache {
 public:
  struct Key {
    LaunchCounts counts;
    int32_t residual_rank = 0, lora_max_rank = 0;
    bool with_sampling = true;
    auto operator<=>(const Key&) const = default;
  };
  struct Stats {
    int64_t captures = 0, replays = 0, eager_steps = 0, evictions = 0;
  };
  static constexpr size_t kCapacity = 64;

  GraphCache() = default;
  ~GraphCache() { clear(); }
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  // Drops every graph when `addresses` differ from those the graphs were captured with.
  void check_addresses(std::vector<const void*> addresses);
  // Replays `key`'s graph on `stream`, or runs `enqueue` eagerly and captures a second run of it.
  void run(const Key& key, cudaStream_t stream, const std::function<void()>& enqueue);
  void count_eager_step() { ++stats_.eager_steps; }
  void clear();

  Stats stats() const { return stats_; }
  size_t size() const { return graphs_.size(); }
  CacheGauge gauge() const;

 private:
  struct Captured {
    cudaGraphExec_t exec = nullptr;
    int64_t last_used = 0;  // captures + replays at its last use
  };
  std::map<Key, Captured> graphs_;
  std::vector<const void*> addresses_;
  Stats stats_;
};

}  // namespace loom::cuda
