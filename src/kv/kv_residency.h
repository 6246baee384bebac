// Which blocks an engine's caches hold right now, by content hash, readable
// from any thread: a KvEventSink (kv_event_sink.h) that keeps the set of
// blocks stored on the device or the host tier of any cache (disk events are
// not counted: the link's peer can read storage itself), and passes every
// event on to the next sink (the KV-event publisher, when there is one).
//
// The KV link's "have" query reads it (kvtransfer/), so a prefill engine does
// not push a decode engine blocks the decode engine already caches (the
// previous turn of a conversation). The answer may be stale by the time the
// blocks are needed: a block evicted meanwhile is read from storage or
// recomputed, as any miss is.
//
// Thread: the sink methods run on the engine thread; holds() on any thread.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>

#include "kv/kv_event_sink.h"

namespace loom {

class KvResidency final : public KvEventSink {
 public:
  explicit KvResidency(KvEventSink* next = nullptr) : next_(next) {}

  void block_stored(const KvStoredBlock& block) override;
  void block_removed(KvCacheId cache, KvMedium medium, const KvBlockHash& hash) override;
  void all_blocks_cleared() override;

  // Whether any cache holds the block on the device or the host tier.
  bool holds(const KvBlockHash& hash) const;
  int64_t num_blocks() const;

 private:
  static uint8_t bit(KvCacheId cache, KvMedium medium) {
    return static_cast<uint8_t>(1u << (static_cast<unsigned>(cache) * 2 + static_cast<unsigned>(medium)));
  }

  KvEventSink* const next_;
  mutable std::mutex mutex_;
  std::map<KvBlockHash, uint8_t> media_;  // hash -> bit(cache, medium) of each place it is stored
};

}  // namespace loom
