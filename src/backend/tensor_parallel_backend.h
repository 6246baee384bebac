// A tensor-parallel group of backends seen as one Backend: N ranks, each an
// ordinary backend over its shard of the model (model/tensor_parallel.h) that
// joins its group's collectives inside forward(). This class runs the ranks'
// forwards at once (a thread each), cuts adapters for them
// (lora/adapter_shard.h), gathers the vocab-parallel logits, and ends the
// group's collectives when a rank fails. The backends (cpu, cuda) build the
// ranks and the group; they add the host tier, which depends on their memory.
//
// Logits come back whole on the host, joined here from the ranks' slices,
// unless the ranks join them on the device (rank 0's result is then whole:
// the CUDA group, which also samples on the device). Token masks and logit
// processing are not declared (the host Sampler runs those rows).
//
// Threads: as Backend (engine thread); forward() uses its own worker threads,
// one per rank, and returns when all are done. On failure it rethrows the
// first rank's own error (the others' say only that the group ended), and the
// next forward() starts afresh.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/tensor_parallel.h"
#include "util/worker_pool.h"

namespace loom {

struct TensorParallelGroup {
  // Ends every collective in flight or to come: the ranks waiting in one throw.
  std::function<void(int32_t failed_rank)> abort;
  // Rearms the group; called before each step, no rank inside a collective.
  std::function<void()> reset;
  // Keeps what the ranks' collectives use alive as long as the ranks (destroyed after them).
  std::shared_ptr<void> owner;
  // Errors whose message starts with this are the group's "another rank failed", not a cause.
  std::string aborted_prefix;
};

class TensorParallelBackend : public Backend {
 public:
  // ranks[r] runs shards[r] of `config` (the whole model) and joins `group` as rank r.
  TensorParallelBackend(const ModelConfig& config, std::vector<TensorParallelShard> shards,
                        std::vector<std::unique_ptr<Backend>> ranks, TensorParallelGroup group);
  ~TensorParallelBackend() override;

  void allocate_kv_cache(const KvCacheShape& shape) override;
  KvCacheShape kv_cache_shape() const override { return ranks_[0]->kv_cache_shape(); }
  // The group's: every rank's pools together.
  int64_t kv_bytes_per_token() const override;
  void allocate_residual_cache(const ResidualCacheShape& shape) override;
  ResidualCacheShape residual_cache_shape() const override { return ranks_[0]->residual_cache_shape(); }
  int64_t residual_bytes_per_token(int32_t max_rank) const override;
  void set_adapter(int32_t slot, std::shared_ptr<const LoraAdapter> adapter) override;
  int32_t max_adapter_slots() const override { return ranks_[0]->max_adapter_slots(); }
  ForwardResult forward(const Batch& batch) override;
  BackendCapabilities capabilities() const override;
  // Every rank's pools as one (backend.h KvPoolMemory: a layer's arrays rank
  // after rank), for a device KV plane that copies rank r's into a peer's rank r.
  KvPoolMemory kv_pool_memory(KvPoolKind pool) override;
  std::vector<CacheGauge> cache_gauges() const override { return ranks_[0]->cache_gauges(); }

 protected:
  int32_t size() const { return static_cast<int32_t>(ranks_.size()); }
  Backend& rank(int32_t r) const { return *ranks_[r]; }
  const TensorParallelShard& shard(int32_t r) const { return shards_[r]; }
  // Runs fn(r) for every rank at once; rethrows the lowest failing rank's own error.
  void run_on_ranks(const std::function<void(int32_t)>& fn);
  // The group's result from the ranks': rank 0's, with the vocab-parallel logits joined.
  ForwardResult finish_forward_parts(std::vector<ForwardResult>& parts);

 private:
  const ModelConfig config_;  // the whole model
  std::vector<TensorParallelShard> shards_;
  TensorParallelGroup group_;
  std::vector<std::unique_ptr<Backend>> ranks_;
  WorkerPool threads_;  // one per rank
};

}  // namespace loom
