// A fake Backend for scheduler / cache tests: no model, but K/V that matter.
//
// Each KV slot stores a number derived from (token, position, adapter slot).
// The "logits" of a sequence put all mass on one token: a hash of every KV
// slot the sequence reads (0 .. num_cached_tokens + i) through its block
// table, modulo the vocabulary. So a wrong block table, a block reused while
// still needed, or a cache hit on the wrong namespace changes the generated
// tokens, and reading a never-written slot throws.
#pragma once

#include <cstdint>
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
  void set_adapter(int32_t, std::shared_ptr<const LoraAdapter>) override {}
  int32_t max_adapter_slots() const override { return 8; }

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
      for (int32_t i = 0; i < sequence.num_new_tokens; ++i) {
        const size_t t = static_cast<size_t>(sequence.token_offset + i);
        LOOM_CHECK(batch.positions[t] == sequence.num_cached_tokens + i);
        slots_[slot_of(sequence.num_cached_tokens + i)] =
            (static_cast<int64_t>(batch.token_ids[t]) * 1000003 + batch.positions[t]) * 131 + batch.adapter_slots[t] + 1;
      }
      uint64_t hash = 1469598103934665603ull;
      const int32_t num_tokens = sequence.num_cached_tokens + sequence.num_new_tokens;
      for (int32_t j = 0; j < num_tokens; ++j) {
        const int64_t value = slots_[slot_of(j)];
        LOOM_CHECK(value != kUnwritten);
        hash = (hash ^ static_cast<uint64_t>(value)) * 1099511628211ull;
      }
      std::vector<float> row(kVocabSize, 0.0f);
      row[static_cast<size_t>((hash >> 17) % kVocabSize)] = 1.0f;
      result.logits.insert(result.logits.end(), row.begin(), row.end());
      result.logit_token_index.push_back(sequence.token_offset + sequence.num_new_tokens - 1);
    }
    return result;
  }

  // Forgets every K/V (as if the blocks were overwritten), to prove reuse is real.
  void scramble_kv() { std::fill(slots_.begin(), slots_.end(), kUnwritten); }

  int64_t num_forward_calls = 0;

 private:
  static constexpr int64_t kUnwritten = -1;
  KvCacheShape shape_;
  std::vector<int64_t> slots_;
};

}  // namespace loom::test
