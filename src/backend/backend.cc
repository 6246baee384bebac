#include "backend/backend.h"

#include "util/error.h"

namespace loom {

void Backend::allocate_residual_cache(const ResidualCacheShape&) {
  throw Error(ErrorKind::kUnsupported, "this backend has no forked (ForkKV) KV sharing",
              "serve forked adapters with --device cpu, or load them with another kv_sharing mode");
}

int64_t Backend::residual_bytes_per_token(int32_t) const { return 0; }

void Backend::allocate_host_kv_cache(KvPoolKind, int32_t) {
  throw Error(ErrorKind::kUnsupported, "this backend has no host tier for the KV cache", "run without --host-kv-memory");
}

std::span<std::byte> Backend::host_kv_block(KvPoolKind, int32_t) {
  fail(ErrorKind::kUnsupported, "this backend has no host tier of the KV cache");
}

void Backend::copy_kv_blocks(KvPoolKind, KvCopyDirection, std::span<const int32_t>, std::span<const int32_t>) {
  throw Error(ErrorKind::kUnsupported, "this backend has no host tier for the KV cache", "");
}

KvPoolMemory Backend::kv_pool_memory(KvPoolKind) {
  fail(ErrorKind::kUnsupported, "this backend cannot stream its KV to another engine's device pools");
}

void Backend::enqueue_forward(const Batch& batch) { enqueued_ = &batch; }

ForwardResult Backend::finish_forward(std::span<const uint32_t> token_masks) {
  if (enqueued_ == nullptr) fail(ErrorKind::kInternal, "finish_forward without enqueue_forward");
  const Batch& batch = *enqueued_;
  enqueued_ = nullptr;
  if (!token_masks.empty() || batch.num_token_mask_rows > 0)
    fail(ErrorKind::kInvalidArgument, "this backend takes no token masks ({} rows asked for)", batch.num_token_mask_rows);
  return forward(batch);
}

}  // namespace loom
