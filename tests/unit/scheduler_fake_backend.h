// A fake Backend for scheduler / cache tests: no model, but K/V that matter.
//
// Each KV slot stores a number derived from (token, position, adapter slot).
// The "logits" of a sequence put all mass on one token: a hash of every KV
// slot the sequence reads (0 .. num_computed_tokens + i) through its block
// table, modulo the vocabulary. So a wrong block table, a block reused while
// still needed, or a cache hit on the wrong namespace changes the generated
// tokens, and reading a never-written slot throws.
//
// KV sharing (backend.h "KV sharing modes"), faked the same way:
//   forked   main (bCache) slots hold the value of adapter slot -1 (the base
//            projections), the rCache slots the value of the forked slot; the
//            hash reads both.
//   base     the decoder slot enters the hash (the K/V are the base rows').
//   write masks: an entry below num_kv_present_tokens (num_residual_present_
//            tokens) is not written; it must already hold exactly what this
//            sequence would have written (so a wrong shared block throws).
//
// Host tier: both pools, copied slot by slot; every copy is logged (copies()).
#pragma once

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "util/error.h"

namespace loom::test {

class FakeBackend final : public Backend {
 public:
  static constexpr int32_t kVocabSize = 97;

  void allocate_kv_cache(const KvCacheShape& shape) override {
    shape_ = shape;
    slots_.assign(static_cast<size_t>(shape.num_blocks) * static_cast<size_t>(shape.block_size), kUnwritten);
  }
  KvCacheShape kv_cache_shape() const override { return shape_; }
  int64_t kv_bytes_per_token() const override { return 8; }
  void allocate_residual_cache(const ResidualCacheShape& shape) override {
    residual_shape_ = shape;
    residual_slots_.assign(static_cast<size_t>(shape.num_blocks) * static_cast<size_t>(shape.block_size), kUnwritten);
  }
  ResidualCacheShape residual_cache_shape() const override { return residual_shape_; }
  int64_t residual_bytes_per_token(int32_t max_rank) const override { return 2 * max_rank; }
  void set_adapter(int32_t, std::shared_ptr<const LoraAdapter>) override {}
  int32_t max_adapter_slots() const override { return 8; }
  BackendCapabilities capabilities() const override {
    BackendCapabilities capabilities;
    capabilities.name = "fake";
    capabilities.kv_sharing_modes = all_kv_sharing_modes();
    capabilities.host_kv_tier = true;
    capabilities.residual_host_kv_tier = declares_residual_host_tier;
    return capabilities;
  }

  ForwardResult forward(const Batch& batch) override {
    ++num_forward_calls;
    ForwardResult result;
    result.vocab_size = kVocabSize;
    for (const BatchSequence& sequence : batch.sequences) {
      auto slot_of = [&](int32_t j) {
        const int32_t block_index = j / shape_.block_size;
        LOOM_CHECK(block_index < sequence.num_blocks);
        const int32_t block = batch.block_tables[static_cast<size_t>(sequence.block_table_offset + block_index)];
        LOOM_CHECK(block >= 0 && block < shape_.num_blocks);
        return static_cast<size_t>(block * shape_.block_size + j % shape_.block_size);
      };
      auto residual_slot_of = [&](int32_t j) {
        const int32_t block_index = j / residual_shape_.block_size;
        LOOM_CHECK(block_index < sequence.num_residual_blocks);
        const int32_t block =
            batch.residual_block_tables[static_cast<size_t>(sequence.residual_block_table_offset + block_index)];
        LOOM_CHECK(block >= 0 && block < residual_shape_.num_blocks);
        return static_cast<size_t>(block * residual_shape_.block_size + j % residual_shape_.block_size);
      };
      const bool forked = sequence.forked_adapter_slot >= 0;
      for (int32_t i = 0; i < sequence.num_new_tokens; ++i) {
        const size_t t = static_cast<size_t>(sequence.token_offset + i);
        const int32_t position = sequence.num_computed_tokens + i;
        LOOM_CHECK(batch.positions[t] == position);
        const int32_t main_slot = forked ? -1 : batch.adapter_slots[t];
        store(slots_[slot_of(position)], value(batch.token_ids[t], position, main_slot),
              position < sequence.num_kv_present_tokens);
        if (forked)
          store(residual_slots_[residual_slot_of(position)], value(batch.token_ids[t], position, sequence.forked_adapter_slot),
                position < sequence.num_residual_present_tokens);
      }
      uint64_t hash = 1469598103934665603ull;
      auto mix = [&](int64_t v) { hash = (hash ^ static_cast<uint64_t>(v)) * 1099511628211ull; };
      const int32_t num_tokens = sequence.num_computed_tokens + sequence.num_new_tokens;
      for (int32_t j = 0; j < num_tokens; ++j) {
        const int64_t v = slots_[slot_of(j)];
        LOOM_CHECK(v != kUnwritten);
        mix(v);
        if (forked) {
          const int64_t r = residual_slots_[residual_slot_of(j)];
          LOOM_CHECK(r != kUnwritten);
          mix(r);
        }
      }
      if (sequence.decoder_adapter_slot >= 0) mix(1000 + sequence.decoder_adapter_slot);
      std::vector<float> row(kVocabSize, 0.0f);
      row[static_cast<size_t>((hash >> 17) % kVocabSize)] = 1.0f;
      result.logits.insert(result.logits.end(), row.begin(), row.end());
      result.logit_token_index.push_back(sequence.token_offset + sequence.num_new_tokens - 1);
    }
    return result;
  }

  // Host tier: per pool (main, rCache), a second slot array per block,
  // copied whole. Copies may come from KvTransferWorker's two threads at once
  // (the cache managers keep their blocks apart); the log is locked.
  void allocate_host_kv_cache(KvPoolKind pool, int32_t num_blocks) override {
    LOOM_CHECK(num_blocks > 0);
    HostPool& host = host_pool(pool);
    host.num_blocks = num_blocks;
    host.slots.assign(static_cast<size_t>(num_blocks) * static_cast<size_t>(block_size(pool)), kUnwritten);
  }
  int32_t num_host_kv_blocks(KvPoolKind pool) const override {
    return pool == KvPoolKind::kMain ? host_main_.num_blocks : host_residual_.num_blocks;
  }
  void copy_kv_blocks(KvPoolKind pool, KvCopyDirection direction, std::span<const int32_t> device_block_ids,
                      std::span<const int32_t> host_block_ids) override {
    LOOM_CHECK(device_block_ids.size() == host_block_ids.size());
    std::vector<int64_t>& device_slots = pool == KvPoolKind::kMain ? slots_ : residual_slots_;
    HostPool& host = host_pool(pool);
    const auto block = static_cast<size_t>(block_size(pool));
    for (size_t i = 0; i < device_block_ids.size(); ++i) {
      LOOM_CHECK(device_block_ids[i] >= 0 && static_cast<size_t>(device_block_ids[i]) * block < device_slots.size());
      LOOM_CHECK(host_block_ids[i] >= 0 && host_block_ids[i] < host.num_blocks);
      auto device =
          device_slots.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(device_block_ids[i]) * block);
      auto host_block =
          host.slots.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(host_block_ids[i]) * block);
      const auto n = static_cast<std::ptrdiff_t>(block);
      if (direction == KvCopyDirection::kDeviceToHost)
        std::copy(device, device + n, host_block);
      else
        std::copy(host_block, host_block + n, device);
    }
    std::lock_guard lock(copies_mutex_);
    copies_.push_back({pool, direction, std::vector<int32_t>(device_block_ids.begin(), device_block_ids.end()),
                       std::vector<int32_t>(host_block_ids.begin(), host_block_ids.end())});
  }
  struct Copy {
    KvPoolKind pool = KvPoolKind::kMain;
    KvCopyDirection direction = KvCopyDirection::kDeviceToHost;
    std::vector<int32_t> device_block_ids, host_block_ids;
  };
  // Every copy_kv_blocks call so far, in the order they ran.
  std::vector<Copy> copies() const {
    std::lock_guard lock(copies_mutex_);
    return copies_;
  }

  // Forgets every K/V (as if the blocks were overwritten), to prove reuse is real.
  void scramble_kv() {
    scramble_kv(KvPoolKind::kMain);
    scramble_kv(KvPoolKind::kResidual);
  }
  // ... of one device pool only.
  void scramble_kv(KvPoolKind pool) {
    std::vector<int64_t>& device_slots = pool == KvPoolKind::kMain ? slots_ : residual_slots_;
    std::fill(device_slots.begin(), device_slots.end(), kUnwritten);
  }

  int64_t num_forward_calls = 0;
  // Whether capabilities() declares a host tier for the rCache pool (its copies work regardless).
  bool declares_residual_host_tier = true;

 private:
  static constexpr int64_t kUnwritten = -1;
  static int64_t value(int32_t token, int32_t position, int32_t adapter_slot) {
    return (static_cast<int64_t>(token) * 1000003 + position) * 131 + adapter_slot + 1;
  }
  // A present entry is read, never written: it must hold what we would write.
  static void store(int64_t& slot, int64_t v, bool is_present) {
    if (is_present)
      LOOM_CHECK(slot == v);
    else
      slot = v;
  }

  struct HostPool {
    int32_t num_blocks = 0;
    std::vector<int64_t> slots;
  };
  HostPool& host_pool(KvPoolKind pool) { return pool == KvPoolKind::kMain ? host_main_ : host_residual_; }
  int32_t block_size(KvPoolKind pool) const {
    return pool == KvPoolKind::kMain ? shape_.block_size : residual_shape_.block_size;
  }

  KvCacheShape shape_;
  ResidualCacheShape residual_shape_;
  std::vector<int64_t> slots_;
  std::vector<int64_t> residual_slots_;
  HostPool host_main_, host_residual_;
  mutable std::mutex copies_mutex_;
  std::vector<Copy> copies_;
};

}  // namespace loom::test
