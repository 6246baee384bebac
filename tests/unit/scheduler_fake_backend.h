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
#pragma once

#include <algorithm>
#include <cstdint>
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

  // Host tier: a second slot array per block, copied whole (kMain only).
  void allocate_host_kv_cache(KvPoolKind pool, int32_t num_blocks) override {
    LOOM_CHECK(pool == KvPoolKind::kMain && num_blocks > 0);
    num_host_blocks_ = num_blocks;
    host_slots_.assign(static_cast<size_t>(num_blocks) * static_cast<size_t>(shape_.block_size), kUnwritten);
  }
  int32_t num_host_kv_blocks(KvPoolKind pool) const override { return pool == KvPoolKind::kMain ? num_host_blocks_ : 0; }
  void copy_kv_blocks(KvPoolKind pool, KvCopyDirection direction, std::span<const int32_t> device_block_ids,
                      std::span<const int32_t> host_block_ids) override {
    LOOM_CHECK(pool == KvPoolKind::kMain && device_block_ids.size() == host_block_ids.size());
    const auto block = static_cast<size_t>(shape_.block_size);
    for (size_t i = 0; i < device_block_ids.size(); ++i) {
      LOOM_CHECK(device_block_ids[i] >= 0 && device_block_ids[i] < shape_.num_blocks);
      LOOM_CHECK(host_block_ids[i] >= 0 && host_block_ids[i] < num_host_blocks_);
      auto device = slots_.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(device_block_ids[i]) * block);
      auto host = host_slots_.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(host_block_ids[i]) * block);
      const auto n = static_cast<std::ptrdiff_t>(block);
      if (direction == KvCopyDirection::kDeviceToHost)
        std::copy(device, device + n, host);
      else
        std::copy(host, host + n, device);
    }
    ++num_copies;
  }

  // Forgets every K/V (as if the blocks were overwritten), to prove reuse is real.
  void scramble_kv() {
    std::fill(slots_.begin(), slots_.end(), kUnwritten);
    std::fill(residual_slots_.begin(), residual_slots_.end(), kUnwritten);
  }

  int64_t num_forward_calls = 0;
  int64_t num_copies = 0;

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

  KvCacheShape shape_;
  ResidualCacheShape residual_shape_;
  std::vector<int64_t> slots_;
  std::vector<int64_t> residual_slots_;
  int32_t num_host_blocks_ = 0;
  std::vector<int64_t> host_slots_;
};

}  // namespace loom::test
