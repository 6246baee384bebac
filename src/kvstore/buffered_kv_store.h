// A memory buffer of KV blocks in front of an optional storage tier: what a
// disaggregated engine (prefill or decode role, DualPath) holds its blocks in
// while they move between engines (DualPath's "PE / DE buffer" in DRAM).
//
// It is a DiskKvStore, so the engine uses it as its disk tier unchanged
// (EngineConfig::kv_store): the engine's write-through offloads land in the
// buffer (and in the storage below, when there is one); the engine's lookups
// and reads find a block in the buffer first (a memcpy), then in storage. A
// block read from storage also enters the buffer, so it can be sent on. Blocks
// received from another engine (kvtransfer/) are put() into the buffer only.
//
// Blocks are in the buffer for a transfer, not as a cache (the host tier is
// the engine's DRAM cache), as in DualPath, where an engine's buffer holds a
// request's KV only while it moves:
//   in transit   received from another engine (put) or read from storage to
//                be sent (load_from_storage): kept until the engine reads
//                them (read_blocks takes them out);
//   outgoing     the engine's own write-through and its reads from storage:
//                kept until a send has delivered them (release_sent), so they
//                can go on to the decode engine.
// The buffer holds at most capacity_bytes of payloads; beyond that outgoing
// blocks leave it first, then blocks in transit, least recently used first
// (they may still be in storage). A block that left the buffer before it was
// sent or read is simply not found: the engine reads storage or recomputes
// it, so a small buffer costs time, never correctness.
//
// Read queue (DualPath §6.1's read_q): queued_read_bytes() counts the payload
// bytes of storage reads asked for and not yet finished, over every caller.
//
// Thread: every method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <set>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "kvstore/disk_kv_store.h"
#include "kvstore/kv_payload.h"

namespace loom {

struct KvBufferStats {
  int64_t num_blocks = 0, num_bytes = 0, capacity_bytes = 0;
  int64_t num_put_blocks = 0;       // since start: blocks that entered the buffer
  int64_t num_evicted_blocks = 0;   // since start: blocks that left it for room
  int64_t num_hit_blocks = 0;       // since start: reads answered from the buffer
};

class BufferedKvStore final : public DiskKvStore {
 public:
  using Payload = std::shared_ptr<const KvPayload>;

  // storage: the tier below (nullptr: the buffer alone). capacity_bytes > 0.
  BufferedKvStore(std::unique_ptr<DiskKvStore> storage, int64_t capacity_bytes);

  bool contains(const KvBlockHash& hash) override;
  // Into the buffer, and written through to the storage when there is one.
  bool write_block(const KvBlockHash& hash, std::span<const std::byte> payload) override;
  // From the buffer where it holds the block, the rest from the storage (then
  // buffered too).
  std::vector<bool> read_blocks(std::span<const KvBlockHash> hashes,
                                std::span<const std::span<std::byte>> destinations) override;
  // The storage's stats (all 0 without storage).
  DiskKvStoreStats stats() const override;

  // Into the buffer only, in transit (a block another engine sent). A payload
  // larger than the whole buffer is dropped.
  void put(const KvBlockHash& hash, std::span<const std::byte> payload);
  void put(const KvBlockHash& hash, Payload payload);  // no copy
  // A send delivered these: outgoing ones leave the buffer (blocks in transit
  // stay for the engine to read).
  void release_sent(std::span<const KvBlockHash> hashes);
  // The buffered payload, or nullptr. Counts as a use (LRU).
  Payload get(const KvBlockHash& hash);
  bool in_buffer(const KvBlockHash& hash) const;
  // Whether the storage tier holds it (false without storage).
  bool in_storage(const KvBlockHash& hash);
  // Waits until every block of `hashes` is buffered or `timeout` passed;
  // returns the buffered payloads (nullptr where one is still missing). Only
  // blocks that never were in the buffer are waited for: one that was (sent
  // and released, or evicted) will not come back by itself, so waiting for it
  // would only delay the send (a prefix hit of this engine is such a block).
  std::vector<Payload> wait_for(std::span<const KvBlockHash> hashes, std::chrono::milliseconds timeout);
  // Reads the blocks that are in storage and not buffered into the buffer, in transit;
  // returns how many it read and their payload bytes. payload_bytes[i]: the
  // size of block hashes[i] (its cache's bytes per block).
  std::pair<int64_t, int64_t> load_from_storage(std::span<const KvBlockHash> hashes,
                                                std::span<const int64_t> payload_bytes);

  bool has_storage() const { return storage_ != nullptr; }
  bool is_persistent() const override { return storage_ != nullptr; }
  std::vector<KvBlockHash> take_removed_blocks() override {
    return storage_ != nullptr ? storage_->take_removed_blocks() : std::vector<KvBlockHash>{};
  }
  const DiskKvStore* storage() const { return storage_.get(); }
  int64_t queued_read_bytes() const { return queued_read_bytes_.load(); }
  KvBufferStats buffer_stats() const;

 private:
  struct Entry {
    Payload payload;
    bool in_transit = false;
    std::list<KvBlockHash>::iterator lru;  // position in its list (front: most recent)
  };
  std::list<KvBlockHash>& lru_of(const Entry& entry) { return entry.in_transit ? transit_lru_ : outgoing_lru_; }
  void add(const KvBlockHash& hash, std::span<const std::byte> bytes, Payload payload, bool in_transit);
  void insert(const KvBlockHash& hash, Payload payload, bool in_transit);  // requires mutex_
  void touch(Entry& entry);                                                // requires mutex_
  void erase(std::map<KvBlockHash, Entry>::iterator it);                    // requires mutex_
  // Reads blocks from the storage into destinations (accounting the read queue).
  std::vector<bool> read_storage(std::span<const KvBlockHash> hashes, std::span<const std::span<std::byte>> destinations);

  const std::unique_ptr<DiskKvStore> storage_;
  const int64_t capacity_bytes_;
  mutable std::mutex mutex_;  // guards the buffer below
  std::condition_variable added_;
  std::map<KvBlockHash, Entry> entries_;
  // Every block that entered the buffer, the latest kMaxRemembered (for wait_for).
  static constexpr size_t kMaxRemembered = 1 << 18;  // ~20 MB of hashes; 512 GB of 2 MiB blocks
  std::set<KvBlockHash> remembered_;
  std::deque<KvBlockHash> remembered_order_;
  std::list<KvBlockHash> outgoing_lru_, transit_lru_;
  int64_t num_bytes_ = 0;
  KvBufferStats counters_;
  std::atomic<int64_t> queued_read_bytes_{0};
};

}  // namespace loom
