#include "backend/cuda/graph_cache.h"

#include <algorithm>

#include "backend/cuda/cuda_check.h"

namespace loom::cuda {

void GraphCache::check_addresses(std::vector<const void*> addresses) {
  if (addresses == addresses_) return;
  clear();
  addresses_ = std::move(addresses);
}

void GraphCache::clear() {
  for (auto& [key, graph] : graphs_) cudaGraphExecDestroy(graph.exec);
  graphs_.clear();
}

void GraphCache::run(const Key& key, cudaStream_t stream, const std::function<void()>& enqueue) {
  const int64_t now = stats_.captures + stats_.replays;
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    LOOM_CUDA_CHECK(cudaGraphLaunch(it->second.exec, stream));
    it->second.last_used = now;
    ++stats_.replays;
    return;
  }
  enqueue();
  if (graphs_.size() >= kCapacity) {
    auto oldest = std::min_element(graphs_.begin(), graphs_.end(), [](const auto& a, const auto& b) {
      return a.second.last_used < b.second.last_used;
    });
    cudaGraphExecDestroy(oldest->second.exec);
    graphs_.erase(oldest);
    ++stats_.evictions;
  }
  cudaGraph_t graph = nullptr;
  LOOM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    enqueue();
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    throw;
  }
  LOOM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  LOOM_CUDA_CHECK(status);
  graphs_.emplace(key, Captured{exec, now});
  ++stats_.captures;
}

CacheGauge GraphCache::gauge() const {
  return {"cuda_graphs", static_cast<int64_t>(graphs_.size()), static_cast<int64_t>(kCapacity), -1, stats_.evictions};
}

}  // namespace loom::cuda
