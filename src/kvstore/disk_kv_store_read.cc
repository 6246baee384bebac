// FileDiskKvStore::read_blocks: every block's header and payload read through
// io_uring, then verified before the caller may use a byte (disk_kv_store.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include <fmt/format.h>

#include "kvstore/block_file.h"
#include "kvstore/file_disk_kv_store.h"
#include "kvstore/uring_reader.h"
#include "util/error.h"

namespace loom {

namespace {

constexpr size_t kDirectIoAlignment = 4096;

bool is_aligned(const void* pointer, size_t size) {
  return reinterpret_cast<uintptr_t>(pointer) % kDirectIoAlignment == 0 && size % kDirectIoAlignment == 0;
}

class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t size) {
    if (size > 0 && ::posix_memalign(&data_, kDirectIoAlignment, size) != 0) throw std::bad_alloc();
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  std::byte* bytes() const { return static_cast<std::byte*>(data_); }

 private:
  void* data_ = nullptr;
};

// One block of a read_blocks call: its open file and the reads of its header and payload.
struct BlockRead {
  BlockRead() = default;
  BlockRead(const BlockRead&) = delete;
  BlockRead& operator=(const BlockRead&) = delete;
  ~BlockRead() {
    if (fd >= 0) ::close(fd);
  }

  int fd = -1;
  int open_error = 0;
  bool direct = false;
  struct stat info {};
  FileRead header;
  FileRead payload;  // length 0 when the file's size already rules the payload out
};

// Opens the block's file (O_DIRECT when allowed and the destination suits it) and sets up its reads.
void open_block(const std::string& path, std::span<std::byte> destination, std::atomic<bool>& direct_io,
                BlockRead& read) {
  read.direct = direct_io.load(std::memory_order_relaxed) && is_aligned(destination.data(), destination.size());
  read.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (read.direct ? O_DIRECT : 0));
  if (read.fd < 0 && read.direct && errno == EINVAL) {  // a file system without O_DIRECT (tmpfs, some FUSE)
    direct_io.store(false, std::memory_order_relaxed);
    read.direct = false;
    read.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  }
  if (read.fd < 0 || ::fstat(read.fd, &read.info) != 0) {
    read.open_error = errno;
    return;
  }
  read.header.fd = read.fd;
  read.header.length = kBlockHeaderBytes;
  read.payload.fd = read.fd;
  read.payload.buffer = destination.data();
  read.payload.offset = kBlockHeaderBytes;
  // A file of another size cannot verify; its header alone then tells a wrong size from a torn file.
  if (read.info.st_size == DiskKvStore::file_bytes(static_cast<int64_t>(destination.size()))) {
    read.payload.length = destination.size();
  }
}

// A file system may take O_DIRECT at open and refuse it at read (EINVAL): opens such a block again,
// buffered, and resets its reads. Returns whether it did.
bool reopen_buffered_after_einval(const std::string& path, BlockRead& read) {
  if (!read.direct || (read.header.error != EINVAL && read.payload.error != EINVAL)) return false;
  ::close(read.fd);
  read.direct = false;
  read.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (read.fd < 0) read.open_error = errno;
  for (FileRead* part : {&read.header, &read.payload}) {
    part->fd = read.fd;
    part->error = 0;
    part->bytes_read = 0;
  }
  return read.fd >= 0;
}

enum class ReadOutcome { kHit, kMissing, kCorrupt, kOtherSize, kReadError };

ReadOutcome verify(const BlockRead& read, const KvBlockHash& hash, std::span<const std::byte> destination) {
  if (read.open_error != 0) {
    return read.open_error == ENOENT || read.open_error == ENOTDIR ? ReadOutcome::kMissing : ReadOutcome::kReadError;
  }
  if (read.header.error != 0 || read.payload.error != 0) return ReadOutcome::kReadError;
  if (read.header.bytes_read < kBlockHeaderBytes) return ReadOutcome::kCorrupt;
  const std::optional<BlockHeader> header = decode_block_header({read.header.buffer, kBlockHeaderBytes});
  if (!header || header->hash != hash) return ReadOutcome::kCorrupt;
  const int64_t file_size = read.info.st_size;
  if (header->payload_bytes != destination.size()) {
    // A whole, self-consistent file of another size: the caller asked for the wrong size, the file is fine.
    return file_size == DiskKvStore::file_bytes(static_cast<int64_t>(header->payload_bytes))
               ? ReadOutcome::kOtherSize
               : ReadOutcome::kCorrupt;
  }
  if (file_size != DiskKvStore::file_bytes(static_cast<int64_t>(destination.size())) ||
      read.payload.bytes_read != destination.size() ||
      block_payload_checksum(destination) != header->payload_checksum) {
    return ReadOutcome::kCorrupt;
  }
  return ReadOutcome::kHit;
}

int read_error(const BlockRead& read) {
  if (read.open_error != 0) return read.open_error;
  return read.header.error != 0 ? read.header.error : read.payload.error;
}

// Unlinks the corrupt file unless another writer has meanwhile published a new one under its name.
void remove_corrupt(const std::string& path, const BlockRead& read) {
  struct stat now {};
  if (::stat(path.c_str(), &now) == 0 && now.st_dev == read.info.st_dev && now.st_ino == read.info.st_ino) {
    ::unlink(path.c_str());
  }
}

}  // namespace

std::vector<bool> FileDiskKvStore::read_blocks(std::span<const KvBlockHash> hashes,
                                               std::span<const std::span<std::byte>> destinations) {
  LOOM_CHECK(hashes.size() == destinations.size());
  const Clock::time_point start = Clock::now();
  const size_t num_blocks = hashes.size();
  std::vector<std::string> paths(num_blocks);
  AlignedBuffer headers(num_blocks * kBlockHeaderBytes);
  std::vector<BlockRead> reads(num_blocks);
  std::vector<FileRead*> file_reads;
  for (size_t i = 0; i < num_blocks; ++i) {
    paths[i] = block_path(config_.directory, hashes[i]);
    reads[i].header.buffer = headers.bytes() + i * kBlockHeaderBytes;
    open_block(paths[i], destinations[i], direct_io_, reads[i]);
    if (reads[i].open_error != 0) continue;
    file_reads.push_back(&reads[i].header);
    if (reads[i].payload.length > 0) file_reads.push_back(&reads[i].payload);
  }
  read_files(file_reads, config_.max_reads_in_flight);
  file_reads.clear();
  for (size_t i = 0; i < num_blocks; ++i) {
    if (!reopen_buffered_after_einval(paths[i], reads[i])) continue;
    direct_io_.store(false, std::memory_order_relaxed);
    file_reads.push_back(&reads[i].header);
    if (reads[i].payload.length > 0) file_reads.push_back(&reads[i].payload);
  }
  read_files(file_reads, config_.max_reads_in_flight);

  std::vector<bool> ok(num_blocks, false);
  int64_t num_payload_bytes = 0;
  for (size_t i = 0; i < num_blocks; ++i) {
    const BlockRead& read = reads[i];
    num_payload_bytes += static_cast<int64_t>(read.payload.bytes_read);
    const ReadOutcome outcome = verify(read, hashes[i], destinations[i]);
    switch (outcome) {
      case ReadOutcome::kHit:
        ::futimens(read.fd, nullptr);  // a hit is a use (mtime orders the trim); failing that is harmless
        ok[i] = true;
        break;
      case ReadOutcome::kMissing:
        break;
      case ReadOutcome::kCorrupt:
        warn_once("corrupt", fmt::format("disk KV tier {}: removing corrupt block file {} (logged once)",
                                         config_.directory, paths[i]));
        remove_corrupt(paths[i], read);
        break;
      case ReadOutcome::kOtherSize:
        warn_once("other size", fmt::format("disk KV tier {}: block {} holds another payload size than the {} "
                                            "bytes asked for (a miss; logged once)",
                                            config_.directory, hashes[i].hex(), destinations[i].size()));
        break;
      case ReadOutcome::kReadError:
        warn_once(fmt::format("read errno {}", read_error(read)),
                  fmt::format("disk KV tier {}: cannot read block file {}: {} (a miss; logged once per error)",
                              config_.directory, paths[i], std::strerror(read_error(read))));
        break;
    }
    std::lock_guard lock(mutex_);
    if (outcome == ReadOutcome::kHit) {
      remember(hashes[i], read.info.st_size);
      ++counters_.num_loaded_blocks;
      counters_.num_loaded_bytes += static_cast<int64_t>(destinations[i].size());
    } else if (outcome == ReadOutcome::kMissing || outcome == ReadOutcome::kCorrupt) {
      forget(hashes[i]);
    }
    if (outcome != ReadOutcome::kHit && outcome != ReadOutcome::kMissing) ++counters_.num_read_failures;
  }
  pace(num_payload_bytes, start);
  std::lock_guard lock(mutex_);
  counters_.read_seconds += std::chrono::duration<double>(Clock::now() - start).count();
  return ok;
}

// Emulates a link of read_bandwidth_bytes_per_second that all of this store's reads share.
void FileDiskKvStore::pace(int64_t num_bytes, Clock::time_point start) {
  const int64_t bandwidth = config_.read_bandwidth_bytes_per_second;
  if (bandwidth <= 0 || num_bytes <= 0) return;
  const auto transfer = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(static_cast<double>(num_bytes) / static_cast<double>(bandwidth)));
  Clock::time_point done;
  {
    std::lock_guard lock(pacing_mutex_);
    done = std::max(start, reads_paced_until_) + transfer;
    reads_paced_until_ = done;
  }
  std::this_thread::sleep_until(done);
}

}  // namespace loom
