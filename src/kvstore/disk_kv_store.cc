#include "kvstore/disk_kv_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "kvstore/block_file.h"
#include "kvstore/file_disk_kv_store.h"
#include "util/error.h"

namespace loom {

static_assert(DiskKvStore::kHeaderBytes == kBlockHeaderBytes);

namespace {

constexpr int64_t kStaleTemporarySeconds = 10 * 60;
// A trim goes down to this fraction of the cap, so that not every write rescans the directory. A
// process also rescans after writing the remaining tenth: the estimate misses other processes' writes.
constexpr double kTrimTargetFraction = 0.9;

int64_t trim_target(int64_t capacity_bytes) {
  return static_cast<int64_t>(static_cast<double>(capacity_bytes) * kTrimTargetFraction);
}

const char* error_text(int error) { return std::strerror(error); }

// 0 or the errno of the first failure.
int write_all(int fd, std::span<const std::byte> bytes, int64_t offset) {
  size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t count = ::pwrite(fd, bytes.data() + written, bytes.size() - written,
                                   offset + static_cast<int64_t>(written));
    if (count < 0 && errno == EINTR) continue;
    if (count < 0) return errno;
    if (count == 0) return EIO;
    written += static_cast<size_t>(count);
  }
  return 0;
}

// Writes the whole block file at `path` (a new file). No fdatasync: a machine crash may lose the
// most recent blocks, and a file torn by it still fails its checksums when read, so it is only a miss.
int write_block_file(const std::string& path, const KvBlockHash& hash, std::span<const std::byte> payload) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return errno;
  std::array<std::byte, kBlockHeaderBytes> header;
  encode_block_header(hash, payload, header);
  int error = write_all(fd, header, 0);
  if (error == 0) error = write_all(fd, payload, kBlockHeaderBytes);
  // Network file systems may report a failed write only at close.
  if (::close(fd) != 0 && error == 0 && errno != EINTR) error = errno;
  return error;
}

// Renames the finished temporary file to its block name, creating the DIR/xx directory on demand.
int publish(const std::string& temporary, const std::string& path, const std::string& subdirectory) {
  if (::rename(temporary.c_str(), path.c_str()) == 0) return 0;
  if (errno != ENOENT) return errno;
  if (::mkdir(subdirectory.c_str(), 0755) != 0 && errno != EEXIST) return errno;
  return ::rename(temporary.c_str(), path.c_str()) == 0 ? 0 : errno;
}

void create_directory(const std::string& path) {
  std::error_code error;
  std::filesystem::create_directories(path, error);
  if (error) fail(ErrorKind::kInvalidArgument, "disk KV tier: {}: {}", path, error.message());
  if (!std::filesystem::is_directory(path, error)) {
    fail(ErrorKind::kInvalidArgument, "disk KV tier: {}: {}", path, error_text(ENOTDIR));
  }
}

// Creates a file in DIR/tmp and renames it into DIR, as a write does, then removes it.
void check_writable(const std::string& directory) {
  const std::string probe = fmt::format("{}/tmp/.probe.{}.{}", directory, ::getpid(), ::gettid());
  const std::string renamed = fmt::format("{}/.probe.{}.{}", directory, ::getpid(), ::gettid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(ErrorKind::kInvalidArgument, "disk KV tier: {}: {}", probe, error_text(errno));
  ::close(fd);
  if (::rename(probe.c_str(), renamed.c_str()) != 0) {
    const int error = errno;
    ::unlink(probe.c_str());
    fail(ErrorKind::kInvalidArgument, "disk KV tier: {}: {}", directory, error_text(error));
  }
  ::unlink(renamed.c_str());
}

}  // namespace

void FileDiskKvStore::warm_start() {
  const int num_stale = remove_stale_temporary_files(config_.directory, kStaleTemporarySeconds);
  if (num_stale > 0) spdlog::info("disk KV tier {}: removed {} stale temporary files", config_.directory, num_stale);
  int64_t total = 0;
  {
    std::lock_guard lock(mutex_);
    for (const BlockFileInfo& file : scan_block_files(config_.directory)) {
      remember(file.hash, file.bytes);
      total += file.bytes;
    }
    directory_bytes_ = total;
  }
  if (total > config_.capacity_bytes) trim_directory();
}

bool FileDiskKvStore::contains(const KvBlockHash& hash) {
  const Clock::time_point now = Clock::now();
  {
    std::lock_guard lock(mutex_);
    if (index_.contains(hash)) return true;
    const auto miss = misses_.find(hash);
    if (miss != misses_.end() && now - miss->second < std::chrono::duration<double>(config_.miss_seconds)) return false;
  }
  struct stat info {};
  const bool found = ::stat(block_path(config_.directory, hash).c_str(), &info) == 0 && S_ISREG(info.st_mode);
  std::lock_guard lock(mutex_);
  if (!found) {
    if (misses_.size() >= kMaxMisses) misses_.clear();
    misses_[hash] = now;
    return false;
  }
  remember(hash, info.st_size);
  return true;
}

bool FileDiskKvStore::write_block(const KvBlockHash& hash, std::span<const std::byte> payload) {
  const std::string path = block_path(config_.directory, hash);
  // Already there (from this process or another): the write counts as a use, refreshing its mtime.
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode)) {
    ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);
    std::lock_guard lock(mutex_);
    remember(hash, info.st_size);
    return true;
  }
  const std::string temporary = fmt::format("{}/tmp/{}.{}.{}.{}", config_.directory, hash.hex(), ::getpid(),
                                            ::gettid(), num_temporary_files_.fetch_add(1));
  int error = write_block_file(temporary, hash, payload);
  if (error == 0) error = publish(temporary, path, block_subdirectory(config_.directory, hash));
  if (error != 0) {
    ::unlink(temporary.c_str());
    {
      std::lock_guard lock(mutex_);
      ++counters_.num_write_failures;
    }
    warn_once(fmt::format("write errno {}", error),
              fmt::format("disk KV tier {}: cannot write block files: {} (they stay off disk; logged once per error)",
                          config_.directory, error_text(error)));
    return false;
  }
  const int64_t bytes = file_bytes(static_cast<int64_t>(payload.size()));
  bool over_cap = false;
  {
    std::lock_guard lock(mutex_);
    remember(hash, bytes);
    ++counters_.num_stored_blocks;
    if (directory_bytes_) *directory_bytes_ += bytes;
    bytes_written_since_scan_ += bytes;
    over_cap = !directory_bytes_ || *directory_bytes_ > config_.capacity_bytes ||
               bytes_written_since_scan_ > config_.capacity_bytes - trim_target(config_.capacity_bytes);
  }
  if (over_cap) trim_directory();
  return true;
}

// Removes the least recently used files until the directory is back under the cap (with
// hysteresis). Scans the directory rather than the index, so other processes' files count too.
std::vector<KvBlockHash> FileDiskKvStore::take_removed_blocks() {
  std::lock_guard lock(mutex_);
  std::vector<KvBlockHash> removed;
  removed.swap(removed_);
  return removed;
}

void FileDiskKvStore::trim_directory() {
  std::unique_lock trim_lock(trim_mutex_, std::try_to_lock);
  if (!trim_lock.owns_lock()) return;  // another thread is trimming now
  {
    std::lock_guard lock(mutex_);
    bytes_written_since_scan_ = 0;
  }
  std::vector<BlockFileInfo> files = scan_block_files(config_.directory);
  int64_t total = 0;
  for (const BlockFileInfo& file : files) total += file.bytes;
  std::vector<KvBlockHash> removed;
  int64_t num_evicted = 0;
  if (total > config_.capacity_bytes) {
    std::sort(files.begin(), files.end(), [](const BlockFileInfo& a, const BlockFileInfo& b) {
      if (a.modified.tv_sec != b.modified.tv_sec) return a.modified.tv_sec < b.modified.tv_sec;
      if (a.modified.tv_nsec != b.modified.tv_nsec) return a.modified.tv_nsec < b.modified.tv_nsec;
      return a.hash < b.hash;
    });
    const int64_t target = trim_target(config_.capacity_bytes);
    for (const BlockFileInfo& file : files) {
      if (total <= target) break;
      if (::unlink(block_path(config_.directory, file.hash).c_str()) == 0) {
        ++num_evicted;
      } else if (const int error = errno; error != ENOENT) {  // ENOENT: another process removed it first
        warn_once(fmt::format("unlink errno {}", error),
                  fmt::format("disk KV tier {}: cannot remove a block file to hold the cap: {} (logged once per error)",
                              config_.directory, error_text(error)));
        continue;
      }
      total -= file.bytes;
      removed.push_back(file.hash);
    }
  }
  std::lock_guard lock(mutex_);
  for (const KvBlockHash& hash : removed) forget(hash);
  for (const KvBlockHash& hash : removed)
    if (removed_.size() < kMaxRemoved) removed_.push_back(hash);
  counters_.num_evicted_blocks += num_evicted;
  directory_bytes_ = total;
}

void FileDiskKvStore::remember(const KvBlockHash& hash, int64_t file_bytes) {
  misses_.erase(hash);
  const auto [entry, inserted] = index_.try_emplace(hash, file_bytes);
  if (!inserted) {
    index_bytes_ -= entry->second;
    entry->second = file_bytes;
  }
  index_bytes_ += file_bytes;
}

void FileDiskKvStore::forget(const KvBlockHash& hash) {
  const auto entry = index_.find(hash);
  if (entry == index_.end()) return;
  index_bytes_ -= entry->second;
  index_.erase(entry);
}

void FileDiskKvStore::warn_once(const std::string& key, const std::string& message) {
  {
    std::lock_guard lock(mutex_);
    if (!logged_.insert(key).second) return;
  }
  spdlog::warn("{}", message);
}

DiskKvStoreStats FileDiskKvStore::stats() const {
  std::lock_guard lock(mutex_);
  DiskKvStoreStats stats = counters_;
  stats.num_blocks = static_cast<int64_t>(index_.size());
  stats.num_bytes = index_bytes_;
  return stats;
}

std::unique_ptr<DiskKvStore> DiskKvStore::open(const DiskKvStoreConfig& config) {
  if (config.directory.empty()) fail(ErrorKind::kInvalidArgument, "disk KV tier: no directory given");
  if (config.capacity_bytes <= 0) {
    fail(ErrorKind::kInvalidArgument, "disk KV tier: {}: capacity_bytes must be positive, not {}", config.directory,
         config.capacity_bytes);
  }
  if (config.max_reads_in_flight <= 0) {
    fail(ErrorKind::kInvalidArgument, "disk KV tier: {}: max_reads_in_flight must be positive, not {}",
         config.directory, config.max_reads_in_flight);
  }
  create_directory(config.directory);
  create_directory(config.directory + "/tmp");
  check_writable(config.directory);
  auto store = std::make_unique<FileDiskKvStore>(config);
  if (config.warm_start) store->warm_start();
  return store;
}

}  // namespace loom
