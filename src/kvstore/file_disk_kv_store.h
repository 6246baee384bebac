// DiskKvStore over a directory of block files (disk_kv_store.h has the
// contract). Private to the kvstore module: DiskKvStore::open makes one.
// disk_kv_store.cc: open, lookups, writes and the size cap;
// disk_kv_store_read.cc: read_blocks (io_uring reads, verification, pacing).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "kvstore/disk_kv_store.h"

namespace loom {

class FileDiskKvStore final : public DiskKvStore {
 public:
  explicit FileDiskKvStore(DiskKvStoreConfig config) : DiskKvStore(std::move(config)), direct_io_(config_.direct_io) {}

  // Indexes the block files already in the directory and removes stale temporary files.
  void warm_start();

  bool contains(const KvBlockHash& hash) override;
  std::vector<KvBlockHash> take_removed_blocks() override;
  bool write_block(const KvBlockHash& hash, std::span<const std::byte> payload) override;
  std::vector<bool> read_blocks(std::span<const KvBlockHash> hashes,
                                std::span<const std::span<std::byte>> destinations) override;
  DiskKvStoreStats stats() const override;

 private:
  using Clock = std::chrono::steady_clock;

  void remember(const KvBlockHash& hash, int64_t file_bytes);  // requires mutex_
  void forget(const KvBlockHash& hash);                        // requires mutex_
  void trim_directory();
  void pace(int64_t num_bytes, Clock::time_point start);
  void warn_once(const std::string& key, const std::string& message);

  mutable std::mutex mutex_;                // guards the members up to trim_mutex_
  std::map<KvBlockHash, int64_t> index_;    // hash -> file bytes
  std::vector<KvBlockHash> removed_;        // trimmed since take_removed_blocks (at most kMaxRemoved)
  static constexpr size_t kMaxRemoved = 1 << 20;
  std::map<KvBlockHash, Clock::time_point> misses_;  // contains() said no at that time (see "Lookups")
  static constexpr size_t kMaxMisses = 1 << 16;      // then forgotten all at once
  int64_t index_bytes_ = 0;
  std::optional<int64_t> directory_bytes_;  // estimate of all block files' bytes; unknown until the first scan
  int64_t bytes_written_since_scan_ = 0;     // this process's part of the estimate (others' are unseen)
  DiskKvStoreStats counters_;               // all but num_blocks / num_bytes (from the index)
  std::set<std::string> logged_;            // warn_once's keys
  std::mutex trim_mutex_;                   // one trim at a time
  std::mutex pacing_mutex_;
  Clock::time_point reads_paced_until_{};   // guarded by pacing_mutex_
  std::atomic<bool> direct_io_;             // cleared when the file system refuses O_DIRECT
  std::atomic<uint64_t> num_temporary_files_{0};
};

}  // namespace loom
