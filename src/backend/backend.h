// The compute backend interface: a ragged batch of sequences in, logits out,
// K/V read and written through per-sequence block tables.
//
// Who calls it: the engine thread only (backends are not thread-safe).
// What it owns: KV tensors and whatever device copies of weights/adapters it
// needs. Block metadata (which block holds what) lives on the host, in kv/;
// the backend just reads/writes the slots the batch names.
//
// KV addressing. Each layer has a K and a V pool of num_blocks x block_size
// slots, each slot num_kv_heads x head_dim floats. Token j of a sequence (0-based
// index in that sequence's KV, i.e. j < num_cached_tokens + num_new_tokens)
// lives in slot  block_table[j / block_size] * block_size + j % block_size.
//
//   sequence s:  |<----- num_cached_tokens ----->|<-- num_new_tokens -->|
//                 already in KV (read only)        written this step, queries
//   block_table:  [b0][b1]...[bk]  covers all num_cached_tokens + num_new_tokens
//
// New token i of sequence s attends to KV entries 0 .. num_cached_tokens + i (causal).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace loom {

struct LoraAdapter;

struct BatchSequence {
  int32_t num_cached_tokens = 0;  // KV entries already written by earlier steps
  int32_t num_new_tokens = 0;     // tokens of this sequence in Batch::token_ids
  int32_t token_offset = 0;       // index of its first new token in Batch::token_ids
  int32_t block_table_offset = 0; // index of its first block id in Batch::block_tables
  int32_t num_blocks = 0;         // >= ceil((num_cached_tokens + num_new_tokens) / block_size)
  bool logits_for_all_tokens = false;  // false: logits for the last new token only
};

struct Batch {
  std::vector<int32_t> token_ids;      // [num_tokens], sequences back to back
  std::vector<int32_t> positions;      // [num_tokens], RoPE positions
  // [num_tokens]: adapter slot applied to each token, -1 = base model. Per token,
  // not per sequence, so that activated LoRA can switch mid-sequence.
  std::vector<int32_t> adapter_slots;
  std::vector<BatchSequence> sequences;
  std::vector<int32_t> block_tables;   // concatenated block ids

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
};

struct ForwardResult {
  // Row r holds the logits for token logit_token_index[r] of the batch.
  // Rows follow batch order: per sequence, its last token (or all of its tokens).
  std::vector<float> logits;              // [num_rows, vocab_size]
  std::vector<int32_t> logit_token_index; // [num_rows]
  int32_t vocab_size = 0;
};

struct KvCacheShape {
  int32_t num_blocks = 0;
  int32_t block_size = 16;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // (Re)allocates the KV pools; previous contents are lost.
  virtual void allocate_kv_cache(const KvCacheShape& shape) = 0;
  virtual KvCacheShape kv_cache_shape() const = 0;
  // Bytes one KV slot takes across all layers (K and V), for capacity planning.
  virtual int64_t kv_bytes_per_token() const = 0;

  // Binds an adapter to a slot (0 <= slot < max_adapter_slots()); nullptr frees it.
  // The backend keeps the shared_ptr while bound.
  virtual void set_adapter(int32_t slot, std::shared_ptr<const LoraAdapter> adapter) = 0;
  virtual int32_t max_adapter_slots() const = 0;

  // Runs the model over the batch, writing K/V of the new tokens into their
  // slots. Preconditions: every block id < num_blocks; adapter slots bound.
  virtual ForwardResult forward(const Batch& batch) = 0;
};

}  // namespace loom
