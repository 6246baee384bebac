// The disk / shared-storage tier of the KV cache (docs/design.md §2): content-addressed
// block files in one directory, which several Loom processes (on one machine,
// or on many over NFS, CephFS or a 3FS mount) may use at once.
//
// A block is named by its KvBlockHash (kv/kv_block_hash.h), which already
// covers the model, the KV layout, the namespace chain and the tokens, so a
// file means the same thing to every process that computes the same hash.
//
// Layout:  DIR/<first 2 hex digits>/<32 hex digits>.kv
// File:    a 4096-byte header, then the payload (the host block's bytes,
//          verbatim, as Backend::host_kv_block gives them):
//
//   offset  size  field
//   0       8     magic "LOOMKV01"
//   8       4     format version (1), little-endian
//   12      4     reserved (0)
//   16      16    the block's KvBlockHash (high, low; little-endian)
//   32      8     payload bytes
//   40      8     XXH3-64 of the payload
//   48      8     XXH3-64 of bytes [0, 48) of the header
//   56..4095      zero
//
// Invariants and failure rules:
// - Publish is atomic: a writer writes DIR/tmp/<hash>.<pid>.<tid>.<n>, then
//   rename()s it to its name, so a reader sees a whole file or none. Two
//   writers of the same block are harmless (same bytes, last rename wins).
// - read() never returns wrong bytes: a missing file, a short file, a bad
//   magic/version, another hash, another payload size or a checksum mismatch
//   is a miss for that block (counted in failures when the file existed); the
//   caller recomputes. A corrupt file found by read() is unlinked; a whole
//   file whose header verifies but names another payload size is not corrupt
//   (the caller asked for the wrong size): a counted miss, and it stays.
// - write() failures (disk full, permission denied, ...) are a value (false),
//   logged once per kind and counted, never an exception: the block simply is
//   not on disk.
// - Size cap: capacity_bytes over the whole directory, across processes. After
//   its writes a process trims the directory to the cap by removing the files
//   used least recently (mtime: a write sets it, a read hit refreshes it), so
//   the cap holds whichever processes wrote. A process rescans the directory
//   when its estimate passes the cap or after writing a tenth of it, so between
//   trims the directory may exceed the cap by about that much per writer.
//
// Lookups: contains() answers from an in-memory index of the blocks this
// process wrote or read, or found at open (warm start, config.warm_start),
// else one stat() of the block's file (a block another process published),
// which then joins the index. A miss is remembered for config.miss_seconds, so the
// engine thread, which asks about the same missing blocks of waiting requests
// every step, stats each at most once a second (another process's publish is
// seen within that). Removal by another process is found by read() (a miss).
//
// I/O: read_blocks() submits all its reads through io_uring (liburing), with
// O_DIRECT where the file system and the destination's alignment allow (else
// buffered reads), many in flight; read_bandwidth_bytes_per_second > 0 paces
// the reads to emulate a slow network store.
//
// Thread: every method may be called from any thread; contains() is meant for
// the engine thread (an index lookup, at most one stat), read_blocks and
// write_block for worker threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/kv_block_hash.h"

namespace loom {

struct DiskKvStoreConfig {
  std::string directory;                         // created if missing
  int64_t capacity_bytes = 0;                    // > 0: cap on the directory's block files (headers included)
  bool warm_start = false;                       // index the blocks already there at open
  int64_t read_bandwidth_bytes_per_second = 0;   // 0: unpaced
  bool direct_io = true;                         // try O_DIRECT
  int32_t max_reads_in_flight = 64;              // io_uring queue depth
  double miss_seconds = 1.0;                     // how long contains() trusts a miss (see "Lookups"); 0: never
};

struct DiskKvStoreStats {
  int64_t num_blocks = 0;          // block files this process knows of (its index)
  int64_t num_bytes = 0;           // their bytes, headers included
  int64_t num_stored_blocks = 0;   // since open: blocks this process published
  int64_t num_loaded_blocks = 0;   // since open: blocks read back whole and verified
  int64_t num_loaded_bytes = 0;    // their payload bytes
  int64_t num_read_failures = 0;   // files that existed but did not verify (or failed to read)
  int64_t num_write_failures = 0;  // writes that did not publish
  int64_t num_evicted_blocks = 0;  // files this process removed to hold the cap
  double read_seconds = 0;         // wall time spent in read_blocks (for bandwidth)
};

class DiskKvStore {
 public:
  // Creates the directory (and DIR/tmp) when missing and checks that it is
  // writable. Throws Error(kInvalidArgument) naming the path and the reason
  // when it cannot be used, Error(kInvalidArgument) for capacity_bytes <= 0.
  static std::unique_ptr<DiskKvStore> open(const DiskKvStoreConfig& config);
  virtual ~DiskKvStore() = default;

  const DiskKvStoreConfig& config() const { return config_; }
  // Bytes one block of `payload_bytes` takes on disk (header included).
  static int64_t file_bytes(int64_t payload_bytes) { return kHeaderBytes + payload_bytes; }
  static constexpr int64_t kHeaderBytes = 4096;

  // Whether the block's file is there (see "Lookups").
  virtual bool contains(const KvBlockHash& hash) = 0;
  // Publishes the payload as block `hash` (atomic; see above). Returns true
  // when the block is on disk afterwards (also when it already was, without
  // writing it again), false on failure.
  virtual bool write_block(const KvBlockHash& hash, std::span<const std::byte> payload) = 0;
  // Reads blocks hashes[i] into destinations[i] (each exactly the payload's
  // size). ok[i] (returned) is true only when the whole payload verified; a
  // false entry's destination holds unspecified bytes.
  // Precondition: hashes.size() == destinations.size().
  virtual std::vector<bool> read_blocks(std::span<const KvBlockHash> hashes,
                                        std::span<const std::span<std::byte>> destinations) = 0;
  virtual DiskKvStoreStats stats() const = 0;
  // The blocks this store removed from the directory to hold its cap since
  // the last call (the engine announces them as KV events). Any thread.
  virtual std::vector<KvBlockHash> take_removed_blocks() { return {}; }
  // False for a store that only buffers blocks in memory (BufferedKvStore without storage).
  virtual bool is_persistent() const { return true; }

 protected:
  explicit DiskKvStore(DiskKvStoreConfig config) : config_(std::move(config)) {}
  DiskKvStoreConfig config_;
};

}  // namespace loom
