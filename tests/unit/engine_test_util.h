// Helpers shared by the engine tests (tests/unit/engine_*_test.cc): a backend
// wrapper that forwards to another backend, reading a request stream to its
// end, and the small engine configuration the KV-sharing tests run on.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <utility>

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "engine/engine.h"

namespace loom::test {

// Forwards what every backend must implement (KV cache, adapters, forward(),
// capabilities()) to `inner`; the optional parts (residual cache, host tier)
// keep Backend's defaults unless a subclass forwards them too. Tests derive
// from it and override only what they change.
class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  void allocate_kv_cache(const KvCacheShape& shape) override { inner_->allocate_kv_cache(shape); }
  KvCacheShape kv_cache_shape() const override { return inner_->kv_cache_shape(); }
  int64_t kv_bytes_per_token() const override { return inner_->kv_bytes_per_token(); }
  void set_adapter(int32_t slot, std::shared_ptr<const LoraAdapter> adapter) override {
    inner_->set_adapter(slot, std::move(adapter));
  }
  int32_t max_adapter_slots() const override { return inner_->max_adapter_slots(); }
  ForwardResult forward(const Batch& batch) override { return inner_->forward(batch); }
  BackendCapabilities capabilities() const override { return inner_->capabilities(); }

 protected:
  Backend& inner() { return *inner_; }
  const Backend& inner() const { return *inner_; }

 private:
  std::unique_ptr<Backend> inner_;
};

// Reads `stream` to its end, calling `visit` on every output (the finished one
// included). Returns false, with a GoogleTest failure, when no output comes
// within 30 s.
template <typename Visit>
bool read_stream(RequestStream& stream, Visit&& visit) {
  for (;;) {
    std::optional<RequestOutput> output = stream.next(std::chrono::seconds(30));
    if (!output) {
      ADD_FAILURE() << "no output within 30 s";
      return false;
    }
    visit(*output);
    if (output->finished) return true;
  }
}

// A small engine for the tiny synthetic models: 4-token blocks, 256 blocks in
// the KV pool and in the residual pool (forked adapters), LoRA rank up to 8,
// 32 tokens a step.
inline EngineConfig small_sharing_engine_config() {
  EngineConfig config;
  config.block_size = 4;
  config.num_kv_blocks = 256;
  config.num_residual_kv_blocks = 256;
  config.max_lora_rank = 8;
  config.max_batch_tokens = 32;
  return config;
}

}  // namespace loom::test
