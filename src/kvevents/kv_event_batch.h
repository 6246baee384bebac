// KV events (kv/kv_event_sink.h) as vLLM's wire schema: the calls of one
// engine step gathered into one msgpack `KVEventBatch`.
//
// Schema: vLLM 0.17 - 0.19's vllm/distributed/kv_events.py (msgspec Structs
// with array_like=True, omit_defaults=True, tag=True), which llm-d's KV-cache
// indexer and NVIDIA Dynamo's KV router decode (newer vLLM, from #42892 on,
// sends events as maps; those routers read both). Every struct is a msgpack
// array of its fields in order; an event's first element is its tag (the
// class name); a trailing field at its default (None) is left out:
//
//   KVEventBatch      [ts: float64 (seconds since the epoch), events: [...], data_parallel_rank: 0]
//   BlockStored       ["BlockStored", block_hashes: [uint64...], parent_block_hash: uint64 | nil,
//                      token_ids: [int...], block_size: int, lora_id: nil, medium: str,
//                      lora_name: str | nil(, extra_keys: [[...] | nil, ...])]
//   BlockRemoved      ["BlockRemoved", block_hashes: [uint64...], medium: str]
//   AllBlocksCleared  ["AllBlocksCleared"]
//
// - Block hashes are ints, as vLLM sends them by default
//   (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES): the low 64 bits of Loom's 128-bit
//   content hash (KvBlockHash::low; vLLM likewise keeps the low 64 bits of
//   its own). They name blocks within this server's stream (stored, then
//   removed); routers key prefixes on token_ids (+ lora_name, extra_keys).
// - A BlockStored holds consecutive blocks of one chain (each the parent of
//   the next; parent_block_hash is the first one's parent, nil under a root),
//   token_ids all their tokens, block_size * len(block_hashes). Consecutive
//   removals of one medium share a BlockRemoved.
// - medium: "GPU" for the device tier (vLLM's name for the compute device's
//   memory, also on Loom's CPU backend), "CPU" for the host tier.
// - Namespaces (kv/kv_key.h): lora_id is always nil (deprecated upstream);
//   lora_name and one extra_keys entry per block say whose K/V it is, vLLM's
//   own form where vLLM has the mode (extra_keys (NAME,) for a LoRA), tagged
//   Loom entries where it has not:
//
//     namespace       member     lora_name   extra_keys entry
//     base            main       nil         nil                 base model (and base-mode adapters)
//     lora/NAME       main       NAME        [NAME]              isolated adapter (what vLLM caches)
//     alora/NAME@S    main       NAME        [NAME, "activated", S]  aLoRA branch from invocation start S
//     fork            main       nil         ["forked"]          forked adapters' shared bCache
//     resid/NAME      residual   NAME        [NAME, "forked", "residual"]  a forked adapter's rCache
//
//   extra_keys is left out when every block's entry is nil (base blocks).
//
// Thread: one (the engine thread, as the sink it is).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kv/kv_event_sink.h"

namespace loom {

// One extra_keys entry: strings and ints.
using KvEventExtraKey = std::vector<std::variant<std::string, int64_t>>;

// Whose K/V a namespace's blocks hold, as events say it (the table above).
struct KvEventOwner {
  std::optional<std::string> lora_name;
  std::optional<KvEventExtraKey> extra_key;
  bool operator==(const KvEventOwner&) const = default;
};
KvEventOwner kv_event_owner(KvCacheId cache, std::string_view kv_namespace);

// vLLM's medium names: "GPU", "CPU".
const char* kv_event_medium_name(KvMedium medium);

class KvEventBatcher final : public KvEventSink {
 public:
  void block_stored(const KvStoredBlock& block) override;
  void block_removed(KvCacheId cache, KvMedium medium, const KvBlockHash& hash) override;
  void all_blocks_cleared() override;

  bool empty() const { return events_.empty(); }
  // Events gathered since the last take_batch() (after merging runs of blocks).
  size_t num_events() const { return events_.size(); }
  // The gathered events as one encoded KVEventBatch stamped `timestamp`
  // (seconds since the epoch); forgets them.
  std::string take_batch(double timestamp);

 private:
  struct Event {
    enum class Kind : uint8_t { kStored, kRemoved, kCleared };
    Kind kind = Kind::kStored;
    KvCacheId cache = KvCacheId::kMain;
    KvMedium medium = KvMedium::kDevice;
    std::vector<uint64_t> block_hashes;
    // kStored:
    std::optional<uint64_t> parent_block_hash;
    std::vector<int32_t> token_ids;
    int32_t block_size = 0;
    KvEventOwner owner;  // extra_key: the entry of every block (one namespace per event)
  };
  std::vector<Event> events_;
};

// The value vLLM's events carry for a block hash.
inline uint64_t kv_event_block_hash(const KvBlockHash& hash) { return hash.low; }

}  // namespace loom
