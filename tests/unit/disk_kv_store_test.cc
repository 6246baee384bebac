// The disk KV tier (kvstore/disk_kv_store.h): round trips, verification of
// every read, write failures as values, the size cap, sharing one directory
// between store instances and processes, and read pacing.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "kv/kv_block_hash.h"
#include "kvstore/disk_kv_store.h"
#include "test_util.h"
#include "util/error.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::byte>;

constexpr int64_t kLargeCapacity = int64_t{1} << 34;

// Deterministic pseudo-random bytes (SplitMix64 words), different for every seed.
Bytes test_payload(size_t size, uint64_t seed) {
  Bytes bytes(size);
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t offset = 0; offset < size; offset += 8) {
    uint64_t word = (state += 0x9e3779b97f4a7c15ull);
    word = (word ^ (word >> 30)) * 0xbf58476d1ce4e5b9ull;
    word = (word ^ (word >> 27)) * 0x94d049bb133111ebull;
    word ^= word >> 31;
    std::memcpy(bytes.data() + offset, &word, std::min<size_t>(8, size - offset));
  }
  return bytes;
}

KvBlockHash test_hash(std::string_view tag, int index) { return hash_string(fmt::format("{} {}", tag, index)); }

// Heap bytes aligned to 4096 (what O_DIRECT reads need); `offset` shifts the view to misalign it.
class AlignedBytes {
 public:
  explicit AlignedBytes(size_t size, size_t offset = 0) : size_(size), offset_(offset) {
    if (::posix_memalign(&data_, 4096, size + offset + 1) != 0) throw std::bad_alloc();
  }
  ~AlignedBytes() { std::free(data_); }
  AlignedBytes(const AlignedBytes&) = delete;
  AlignedBytes& operator=(const AlignedBytes&) = delete;
  std::span<std::byte> span() const { return {static_cast<std::byte*>(data_) + offset_, size_}; }
  Bytes bytes() const { return {span().begin(), span().end()}; }

 private:
  void* data_ = nullptr;
  size_t size_;
  size_t offset_;
};

bool read_one(DiskKvStore& store, const KvBlockHash& hash, std::span<std::byte> destination) {
  const std::span<std::byte> destinations[] = {destination};
  return store.read_blocks({&hash, 1}, destinations)[0];
}

// The block's bytes when a read of `size` bytes verifies.
std::optional<Bytes> read_back(DiskKvStore& store, const KvBlockHash& hash, size_t size) {
  Bytes bytes(size);
  if (!read_one(store, hash, bytes)) return std::nullopt;
  return bytes;
}

void flip_byte(const std::string& path, int64_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  unsigned char byte = 0;
  ASSERT_EQ(::pread(fd, &byte, 1, offset), 1);
  byte ^= 0x40;
  ASSERT_EQ(::pwrite(fd, &byte, 1, offset), 1);
  ::close(fd);
}

void set_mtime(const std::string& path, time_t seconds) {
  const timespec times[2] = {{seconds, 0}, {seconds, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path << ": " << std::strerror(errno);
}

class DiskKvStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char name[] = "/tmp/loom-disk-kv-XXXXXX";
    ASSERT_NE(::mkdtemp(name), nullptr);
    dir_ = name;
  }
  void TearDown() override {
    std::error_code error;
    fs::remove_all(dir_, error);
  }

  DiskKvStoreConfig config(int64_t capacity_bytes = kLargeCapacity) const {
    DiskKvStoreConfig config;
    config.directory = dir_;
    config.capacity_bytes = capacity_bytes;
    config.miss_seconds = 0;  // every lookup stats (MissesAreTrustedForAWhile tests the window)
    return config;
  }

  // The layout of disk_kv_store.h, spelled out independently of the implementation.
  std::string block_file(const KvBlockHash& hash) const {
    const std::string hex = hash.hex();
    return fmt::format("{}/{}/{}.kv", dir_, hex.substr(0, 2), hex);
  }

  // Bytes of all block files in the directory (what the cap bounds).
  int64_t directory_block_bytes() const {
    int64_t total = 0;
    for (const fs::directory_entry& entry : fs::recursive_directory_iterator(dir_)) {
      if (entry.is_regular_file() && entry.path().extension() == ".kv") {
        total += static_cast<int64_t>(entry.file_size());
      }
    }
    return total;
  }

  std::vector<std::string> temporary_files() const {
    std::vector<std::string> names;
    for (const fs::directory_entry& entry : fs::directory_iterator(dir_ + "/tmp")) names.push_back(entry.path());
    return names;
  }

  std::string dir_;
};

TEST_F(DiskKvStoreTest, RoundTripsPayloadsOfSeveralSizes) {
  for (const bool direct_io : {true, false}) {
    SCOPED_TRACE(direct_io ? "direct_io" : "buffered");
    DiskKvStoreConfig store_config = config();
    store_config.directory = fmt::format("{}/{}", dir_, direct_io ? "direct" : "buffered");
    store_config.direct_io = direct_io;
    const auto store = DiskKvStore::open(store_config);

    const std::vector<size_t> sizes = {1, 1000, 4 * 4096, 12345};
    int64_t num_bytes = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const KvBlockHash hash = test_hash("round trip", static_cast<int>(i));
      const Bytes payload = test_payload(sizes[i], i);
      EXPECT_FALSE(store->contains(hash));
      ASSERT_TRUE(store->write_block(hash, payload));
      EXPECT_TRUE(store->contains(hash));
      const std::string path = fmt::format("{}/{}/{}.kv", store_config.directory, hash.hex().substr(0, 2), hash.hex());
      ASSERT_TRUE(fs::exists(path));
      EXPECT_EQ(static_cast<int64_t>(fs::file_size(path)), DiskKvStore::file_bytes(static_cast<int64_t>(sizes[i])));
      num_bytes += DiskKvStore::file_bytes(static_cast<int64_t>(sizes[i]));

      AlignedBytes aligned(sizes[i]);  // O_DIRECT when 4096 | size and the file system allows it
      ASSERT_TRUE(read_one(*store, hash, aligned.span()));
      EXPECT_EQ(aligned.bytes(), payload);
      AlignedBytes misaligned(sizes[i], 1);  // always buffered
      ASSERT_TRUE(read_one(*store, hash, misaligned.span()));
      EXPECT_EQ(misaligned.bytes(), payload);
    }
    // Writing a block that is already there succeeds without publishing it again.
    EXPECT_TRUE(store->write_block(test_hash("round trip", 0), test_payload(sizes[0], 0)));

    const DiskKvStoreStats stats = store->stats();
    EXPECT_EQ(stats.num_blocks, 4);
    EXPECT_EQ(stats.num_bytes, num_bytes);
    EXPECT_EQ(stats.num_stored_blocks, 4);
    EXPECT_EQ(stats.num_loaded_blocks, 8);
    EXPECT_EQ(stats.num_loaded_bytes, 2 * static_cast<int64_t>(1 + 1000 + 4 * 4096 + 12345));
    EXPECT_EQ(stats.num_read_failures, 0);
    EXPECT_EQ(stats.num_write_failures, 0);
    EXPECT_GT(stats.read_seconds, 0);
    EXPECT_TRUE(fs::is_empty(store_config.directory + "/tmp"));
  }
}

TEST_F(DiskKvStoreTest, ReadsManyBlocksWithFewReadsInFlight) {
  DiskKvStoreConfig store_config = config();
  store_config.max_reads_in_flight = 3;
  const auto store = DiskKvStore::open(store_config);
  constexpr int kNumBlocks = 24;
  std::vector<KvBlockHash> hashes;
  std::vector<std::unique_ptr<AlignedBytes>> buffers;
  std::vector<std::span<std::byte>> destinations;
  for (int i = 0; i < kNumBlocks; ++i) {
    const size_t size = i % 2 == 0 ? 8192 : 5000 + static_cast<size_t>(i);
    hashes.push_back(test_hash("many", i));
    ASSERT_TRUE(store->write_block(hashes.back(), test_payload(size, 100 + i)));
    buffers.push_back(std::make_unique<AlignedBytes>(size, i % 4 == 0 ? 0 : 8));
    destinations.push_back(buffers.back()->span());
  }
  const std::vector<bool> ok = store->read_blocks(hashes, destinations);
  ASSERT_EQ(ok.size(), static_cast<size_t>(kNumBlocks));
  for (int i = 0; i < kNumBlocks; ++i) {
    EXPECT_TRUE(ok[i]) << i;
    EXPECT_EQ(buffers[i]->bytes(), test_payload(destinations[i].size(), 100 + i)) << i;
  }
  EXPECT_EQ(store->stats().num_loaded_blocks, kNumBlocks);
}

TEST_F(DiskKvStoreTest, MissingBlockIsAMissNotAFailure) {
  const auto store = DiskKvStore::open(config());
  const KvBlockHash present = test_hash("present", 0);
  const KvBlockHash missing = test_hash("missing", 0);
  ASSERT_TRUE(store->write_block(present, test_payload(3000, 1)));
  EXPECT_FALSE(store->contains(missing));
  EXPECT_FALSE(read_back(*store, missing, 3000));

  Bytes first(3000), second(3000), third(3000);
  const KvBlockHash hashes[] = {present, missing, present};
  const std::span<std::byte> destinations[] = {first, second, third};
  EXPECT_EQ(store->read_blocks(hashes, destinations), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(first, test_payload(3000, 1));
  EXPECT_EQ(third, test_payload(3000, 1));
  EXPECT_EQ(store->stats().num_read_failures, 0);
  EXPECT_EQ(store->stats().num_loaded_blocks, 2);
}

TEST_F(DiskKvStoreTest, CorruptFilesAreCountedMissesAndRemoved) {
  const auto store = DiskKvStore::open(config());
  constexpr size_t kSize = 3 * 4096;
  const int64_t file_size = DiskKvStore::file_bytes(kSize);
  const KvBlockHash other = test_hash("other", 0);
  ASSERT_TRUE(store->write_block(other, test_payload(kSize, 999)));

  struct Corruption {
    std::string name;
    std::function<void(const std::string& path)> apply;
  };
  const std::vector<Corruption> corruptions = {
      {"truncated payload", [&](const std::string& path) { ASSERT_EQ(::truncate(path.c_str(), file_size - 100), 0); }},
      {"truncated header", [&](const std::string& path) { ASSERT_EQ(::truncate(path.c_str(), 100), 0); }},
      {"empty", [&](const std::string& path) { ASSERT_EQ(::truncate(path.c_str(), 0), 0); }},
      {"longer", [&](const std::string& path) { ASSERT_EQ(::truncate(path.c_str(), file_size + 1), 0); }},
      {"payload byte", [&](const std::string& path) { flip_byte(path, 4096 + 500); }},
      {"last payload byte", [&](const std::string& path) { flip_byte(path, file_size - 1); }},
      {"magic byte", [&](const std::string& path) { flip_byte(path, 3); }},
      {"hash byte", [&](const std::string& path) { flip_byte(path, 20); }},
      {"payload checksum byte", [&](const std::string& path) { flip_byte(path, 41); }},
      {"another hash's file", [&](const std::string& path) {
         const KvBlockHash donor = test_hash("donor", 0);
         ASSERT_TRUE(store->write_block(donor, test_payload(kSize, 7)));
         ASSERT_EQ(::rename(block_file(donor).c_str(), path.c_str()), 0);
       }},
  };
  int64_t num_failures = 0;
  for (size_t i = 0; i < corruptions.size(); ++i) {
    SCOPED_TRACE(corruptions[i].name);
    const KvBlockHash hash = test_hash("corrupt", static_cast<int>(i));
    const Bytes payload = test_payload(kSize, i);
    ASSERT_TRUE(store->write_block(hash, payload));
    corruptions[i].apply(block_file(hash));
    AlignedBytes destination(kSize);
    EXPECT_FALSE(read_one(*store, hash, destination.span()));
    EXPECT_EQ(store->stats().num_read_failures, ++num_failures);
    EXPECT_FALSE(fs::exists(block_file(hash)));
    EXPECT_FALSE(store->contains(hash));
    // The block can be written again and then reads back.
    ASSERT_TRUE(store->write_block(hash, payload));
    ASSERT_TRUE(read_one(*store, hash, destination.span()));
    EXPECT_EQ(destination.bytes(), payload);
  }
  EXPECT_EQ(read_back(*store, other, kSize), test_payload(kSize, 999));
  EXPECT_EQ(store->stats().num_read_failures, num_failures);
}

// A whole file read with another destination size: a miss counted as a failure (the caller's
// size is wrong), but the file verifies as itself and stays for readers that ask for its size.
TEST_F(DiskKvStoreTest, WrongDestinationSizeIsAFailedMissThatKeepsTheFile) {
  const auto store = DiskKvStore::open(config());
  const KvBlockHash hash = test_hash("sized", 0);
  ASSERT_TRUE(store->write_block(hash, test_payload(8192, 3)));
  EXPECT_FALSE(read_back(*store, hash, 8191));
  EXPECT_FALSE(read_back(*store, hash, 8193));
  AlignedBytes larger(3 * 4096);
  EXPECT_FALSE(read_one(*store, hash, larger.span()));
  EXPECT_EQ(store->stats().num_read_failures, 3);
  EXPECT_TRUE(fs::exists(block_file(hash)));
  EXPECT_TRUE(store->contains(hash));
  EXPECT_EQ(read_back(*store, hash, 8192), test_payload(8192, 3));
}

TEST_F(DiskKvStoreTest, WriteFailuresAreValuesNotExceptions) {
  const auto store = DiskKvStore::open(config());
  // The block's DIR/xx is a file, so its publish cannot succeed (permissions do not stop root).
  const KvBlockHash blocked = test_hash("blocked", 0);
  const std::string subdirectory = fmt::format("{}/{}", dir_, blocked.hex().substr(0, 2));
  { std::ofstream(subdirectory) << "not a directory"; }
  bool written = true;
  EXPECT_NO_THROW(written = store->write_block(blocked, test_payload(1000, 1)));
  EXPECT_FALSE(written);
  EXPECT_EQ(store->stats().num_write_failures, 1);
  EXPECT_FALSE(store->write_block(blocked, test_payload(1000, 1)));
  EXPECT_EQ(store->stats().num_write_failures, 2);
  EXPECT_FALSE(store->contains(blocked));
  EXPECT_FALSE(read_back(*store, blocked, 1000));
  EXPECT_TRUE(temporary_files().empty());
  EXPECT_EQ(store->stats().num_stored_blocks, 0);

  if (::geteuid() != 0) {
    const KvBlockHash denied = test_hash("denied", 0);
    const std::string denied_subdirectory = fmt::format("{}/{}", dir_, denied.hex().substr(0, 2));
    fs::create_directories(denied_subdirectory);
    ASSERT_EQ(::chmod(denied_subdirectory.c_str(), 0555), 0);
    EXPECT_FALSE(store->write_block(denied, test_payload(1000, 2)));
    EXPECT_EQ(store->stats().num_write_failures, 3);
    EXPECT_TRUE(temporary_files().empty());
    ::chmod(denied_subdirectory.c_str(), 0755);
  }
  // Other blocks still write.
  const KvBlockHash fine = test_hash("fine", 0);
  ASSERT_NE(fine.hex().substr(0, 2), blocked.hex().substr(0, 2));
  EXPECT_TRUE(store->write_block(fine, test_payload(1000, 3)));
}

TEST_F(DiskKvStoreTest, OpenRejectsUnusableDirectoriesAndCapacities) {
  const std::string file = dir_ + "/a-file";
  { std::ofstream(file) << "x"; }
  DiskKvStoreConfig under_file = config();
  under_file.directory = file + "/store";
  test::expect_error([&] { DiskKvStore::open(under_file); }, ErrorKind::kInvalidArgument, {file + "/store"});
  DiskKvStoreConfig is_file = config();
  is_file.directory = file;
  test::expect_error([&] { DiskKvStore::open(is_file); }, ErrorKind::kInvalidArgument, {file});
  test::expect_error([&] { DiskKvStore::open(config(0)); }, ErrorKind::kInvalidArgument, {"capacity"});
  test::expect_error([&] { DiskKvStore::open(config(-5)); }, ErrorKind::kInvalidArgument, {"capacity"});
  if (::geteuid() != 0) {
    const std::string read_only = dir_ + "/read-only";
    fs::create_directories(read_only + "/tmp");
    ::chmod((read_only + "/tmp").c_str(), 0555);
    DiskKvStoreConfig denied = config();
    denied.directory = read_only;
    test::expect_error([&] { DiskKvStore::open(denied); }, ErrorKind::kInvalidArgument, {read_only});
    ::chmod((read_only + "/tmp").c_str(), 0755);
  }
}

// The cap holds by removing the least recently used files (mtime: written or read). Explicit old
// mtimes make the order deterministic: block i is written at "base + i", and a read sets "now".
TEST_F(DiskKvStoreTest, CapRemovesTheLeastRecentlyUsedFiles) {
  constexpr size_t kSize = 3 * 4096;
  const int64_t block_bytes = DiskKvStore::file_bytes(kSize);
  const int64_t capacity = 10 * block_bytes;
  const auto store = DiskKvStore::open(config(capacity));
  const time_t base = std::time(nullptr) - 100000;
  constexpr int kNumBlocks = 30;
  constexpr int kReadEarly = 2;
  for (int i = 0; i < kNumBlocks; ++i) {
    ASSERT_TRUE(store->write_block(test_hash("capped", i), test_payload(kSize, i)));
    set_mtime(block_file(test_hash("capped", i)), base + i);
    if (i == 5) {
      ASSERT_TRUE(read_back(*store, test_hash("capped", kReadEarly), kSize));  // now the most recent
    }
    EXPECT_LE(directory_block_bytes(), capacity) << "after block " << i;
  }
  EXPECT_TRUE(fs::exists(block_file(test_hash("capped", kReadEarly))));
  EXPECT_EQ(read_back(*store, test_hash("capped", kReadEarly), kSize), test_payload(kSize, kReadEarly));
  for (int i = kNumBlocks - 5; i < kNumBlocks; ++i) {
    EXPECT_EQ(read_back(*store, test_hash("capped", i), kSize), test_payload(kSize, i)) << i;
  }
  for (int i : {0, 1, 3, 4, 10, 20}) {
    EXPECT_FALSE(fs::exists(block_file(test_hash("capped", i)))) << i;
    EXPECT_FALSE(store->contains(test_hash("capped", i))) << i;
    EXPECT_FALSE(read_back(*store, test_hash("capped", i), kSize)) << i;
  }
  const DiskKvStoreStats stats = store->stats();
  EXPECT_GE(stats.num_evicted_blocks, kNumBlocks - 10);
  EXPECT_EQ(stats.num_read_failures, 0);
  EXPECT_LE(stats.num_bytes, capacity);
  EXPECT_EQ(stats.num_bytes, directory_block_bytes());
}

// Another process's files count toward the cap: a trim removes them too. Each writer may add about a
// tenth of the cap (and a block) before it rescans, so the directory stays within that of the cap.
TEST_F(DiskKvStoreTest, CapCountsOtherInstancesFiles) {
  constexpr size_t kSize = 4096;
  const int64_t block_bytes = DiskKvStore::file_bytes(kSize);
  const int64_t capacity = 10 * block_bytes;
  const auto first = DiskKvStore::open(config(capacity));
  const auto second = DiskKvStore::open(config(capacity));
  const time_t base = std::time(nullptr) - 100000;
  for (int i = 0; i < 40; ++i) {
    DiskKvStore& store = i % 2 == 0 ? *first : *second;
    ASSERT_TRUE(store.write_block(test_hash("shared cap", i), test_payload(kSize, i)));
    set_mtime(block_file(test_hash("shared cap", i)), base + i);
    EXPECT_LE(directory_block_bytes(), capacity + 2 * (capacity / 10 + block_bytes)) << "after block " << i;
  }
  EXPECT_GT(first->stats().num_evicted_blocks + second->stats().num_evicted_blocks, 0);
  EXPECT_TRUE(fs::exists(block_file(test_hash("shared cap", 39))));
  EXPECT_FALSE(fs::exists(block_file(test_hash("shared cap", 0))));
}

TEST_F(DiskKvStoreTest, TwoInstancesShareOneDirectory) {
  const auto writer = DiskKvStore::open(config());
  const auto reader = DiskKvStore::open(config());
  const KvBlockHash hash = test_hash("shared", 0);
  EXPECT_FALSE(reader->contains(hash));
  ASSERT_TRUE(writer->write_block(hash, test_payload(5000, 5)));
  EXPECT_EQ(reader->stats().num_blocks, 0);
  EXPECT_TRUE(reader->contains(hash));  // by stat
  EXPECT_EQ(reader->stats().num_blocks, 1);
  EXPECT_EQ(read_back(*reader, hash, 5000), test_payload(5000, 5));
  // The reader's write of the same block finds it there.
  EXPECT_TRUE(reader->write_block(hash, test_payload(5000, 5)));
  EXPECT_EQ(reader->stats().num_stored_blocks, 0);

  // Removal by the other instance shows up as a plain miss.
  ASSERT_EQ(::unlink(block_file(hash).c_str()), 0);
  EXPECT_FALSE(read_back(*reader, hash, 5000));
  EXPECT_FALSE(reader->contains(hash));
  EXPECT_EQ(reader->stats().num_read_failures, 0);
}

TEST_F(DiskKvStoreTest, MissesAreTrustedForAWhile) {
  DiskKvStoreConfig windowed = config();
  windowed.miss_seconds = 3600;
  const auto writer = DiskKvStore::open(config());
  const auto reader = DiskKvStore::open(windowed);
  const KvBlockHash other = test_hash("window", 0), own = test_hash("window", 1);
  EXPECT_FALSE(reader->contains(other));
  ASSERT_TRUE(writer->write_block(other, test_payload(3000, 1)));
  EXPECT_FALSE(reader->contains(other));  // within the window: no stat
  EXPECT_EQ(read_back(*reader, other, 3000), test_payload(3000, 1));  // a read still finds it
  EXPECT_TRUE(reader->contains(other));   // and it joined the index
  EXPECT_FALSE(reader->contains(own));
  ASSERT_TRUE(reader->write_block(own, test_payload(3000, 2)));
  EXPECT_TRUE(reader->contains(own));  // its own write ends the miss at once
}

TEST_F(DiskKvStoreTest, WarmStartIndexesExistingBlocksAndRemovesStaleTemporaries) {
  {
    const auto writer = DiskKvStore::open(config());
    for (int i = 0; i < 12; ++i) ASSERT_TRUE(writer->write_block(test_hash("warm", i), test_payload(2000 + i, i)));
  }
  const std::string stale = dir_ + "/tmp/dead-writer.1.1.0";
  const std::string fresh = dir_ + "/tmp/live-writer.1.1.0";
  { std::ofstream(stale) << "partial"; }
  { std::ofstream(fresh) << "partial"; }
  set_mtime(stale, std::time(nullptr) - 11 * 60);
  { std::ofstream(dir_ + "/ab-not-a-block") << "ignored"; }

  const auto cold = DiskKvStore::open(config());
  EXPECT_EQ(cold->stats().num_blocks, 0);
  EXPECT_TRUE(fs::exists(stale));

  DiskKvStoreConfig warm_config = config();
  warm_config.warm_start = true;
  const auto warm = DiskKvStore::open(warm_config);
  const DiskKvStoreStats stats = warm->stats();
  EXPECT_EQ(stats.num_blocks, 12);
  int64_t num_bytes = 0;
  for (int i = 0; i < 12; ++i) num_bytes += DiskKvStore::file_bytes(2000 + i);
  EXPECT_EQ(stats.num_bytes, num_bytes);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(fresh));
  EXPECT_EQ(read_back(*warm, test_hash("warm", 7), 2007), test_payload(2007, 7));
}

TEST_F(DiskKvStoreTest, ConcurrentWritersOfTheSameBlocks) {
  const auto first = DiskKvStore::open(config());
  const auto second = DiskKvStore::open(config());
  constexpr int kNumBlocks = 50;
  constexpr size_t kSize = 2 * 4096;
  std::vector<std::thread> threads;
  std::atomic<int> num_failed_writes{0};
  for (int thread = 0; thread < 4; ++thread) {
    threads.emplace_back([&, thread] {
      DiskKvStore& store = thread % 2 == 0 ? *first : *second;
      for (int n = 0; n < kNumBlocks; ++n) {
        const int i = thread < 2 ? n : kNumBlocks - 1 - n;  // two threads forward, two backward
        if (!store.write_block(test_hash("concurrent", i), test_payload(kSize, i))) ++num_failed_writes;
      }
    });
  }
  // Meanwhile a reader on each instance: every block is a miss or the right bytes.
  std::atomic<bool> writing{true};
  std::atomic<int> num_wrong_reads{0};
  std::vector<std::thread> readers;
  for (DiskKvStore* store : {first.get(), second.get()}) {
    readers.emplace_back([&, store] {
      while (writing) {
        for (int i = 0; i < kNumBlocks; ++i) {
          const std::optional<Bytes> bytes = read_back(*store, test_hash("concurrent", i), kSize);
          if (bytes && *bytes != test_payload(kSize, i)) ++num_wrong_reads;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  writing = false;
  for (std::thread& thread : readers) thread.join();
  EXPECT_EQ(num_failed_writes, 0);
  EXPECT_EQ(num_wrong_reads, 0);
  for (int i = 0; i < kNumBlocks; ++i) {
    EXPECT_EQ(read_back(*first, test_hash("concurrent", i), kSize), test_payload(kSize, i)) << i;
    EXPECT_EQ(read_back(*second, test_hash("concurrent", i), kSize), test_payload(kSize, i)) << i;
  }
  EXPECT_TRUE(temporary_files().empty());
  EXPECT_EQ(first->stats().num_read_failures + second->stats().num_read_failures, 0);
  EXPECT_EQ(first->stats().num_write_failures + second->stats().num_write_failures, 0);
}

// Another process publishing while this one reads: each read is a miss or the right bytes.
TEST_F(DiskKvStoreTest, ReaderNeverSeesWrongBytesFromAWritingProcess) {
  constexpr int kNumBlocks = 100;
  const auto size_of = [](int i) { return size_t{16384} + static_cast<size_t>(i) * 64; };
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int status = 0;
    try {
      const auto writer = DiskKvStore::open(config());
      for (int i = 0; i < kNumBlocks; ++i) {
        if (!writer->write_block(test_hash("forked", i), test_payload(size_of(i), i))) status = 1;
      }
    } catch (...) {
      status = 2;
    }
    ::_exit(status);
  }
  const auto reader = DiskKvStore::open(config());
  int num_hits = 0;
  int num_wrong = 0;
  int child_status = 0;
  for (bool child_done = false; !child_done;) {
    child_done = ::waitpid(child, &child_status, WNOHANG) == child;
    for (int i = 0; i < kNumBlocks; ++i) {
      const std::optional<Bytes> bytes = read_back(*reader, test_hash("forked", i), size_of(i));
      if (!bytes) continue;
      ++num_hits;
      if (*bytes != test_payload(size_of(i), i)) ++num_wrong;
    }
  }
  ASSERT_TRUE(WIFEXITED(child_status));
  EXPECT_EQ(WEXITSTATUS(child_status), 0);
  EXPECT_EQ(num_wrong, 0);
  EXPECT_GE(num_hits, kNumBlocks);  // the last pass, after the child exited, hits every block
  EXPECT_EQ(reader->stats().num_read_failures, 0);
}

// A writer killed mid-write leaves at most a temporary file: every block file verifies.
TEST_F(DiskKvStoreTest, KilledWriterLeavesNoTornBlock) {
  constexpr int kMaxBlocks = 5000;
  constexpr size_t kSize = size_t{1} << 20;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      const auto writer = DiskKvStore::open(config());
      for (int i = 0; i < kMaxBlocks; ++i) writer->write_block(test_hash("killed", i), test_payload(kSize, i));
    } catch (...) {
    }
    ::_exit(0);
  }
  const auto count_block_files = [&] {
    int count = 0;
    for (const fs::directory_entry& entry : fs::recursive_directory_iterator(dir_)) {
      count += entry.path().extension() == ".kv" ? 1 : 0;
    }
    return count;
  };
  for (int waited_ms = 0; count_block_files() < 2 && waited_ms < 5000; waited_ms += 5) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int child_status = 0;
  ASSERT_EQ(::waitpid(child, &child_status, 0), child);

  std::map<std::string, int> index_of_file;
  for (int i = 0; i < kMaxBlocks; ++i) index_of_file[fs::path(block_file(test_hash("killed", i))).filename()] = i;
  const auto reader = DiskKvStore::open(config());
  int num_verified = 0;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(dir_)) {
    if (entry.path().extension() != ".kv") continue;
    const auto found = index_of_file.find(entry.path().filename());
    ASSERT_NE(found, index_of_file.end()) << entry.path();
    const int i = found->second;
    AlignedBytes destination(kSize);
    EXPECT_TRUE(read_one(*reader, test_hash("killed", i), destination.span())) << entry.path();
    EXPECT_EQ(destination.bytes(), test_payload(kSize, i)) << entry.path();
    ++num_verified;
  }
  EXPECT_GE(num_verified, 2);
  EXPECT_EQ(reader->stats().num_read_failures, 0);
}

TEST_F(DiskKvStoreTest, BandwidthCapPacesReads) {
  DiskKvStoreConfig store_config = config();
  store_config.read_bandwidth_bytes_per_second = 50'000'000;
  const auto store = DiskKvStore::open(store_config);
  constexpr int kNumBlocks = 10;
  constexpr size_t kSize = 1'000'000;  // 10 MB in all: 0.2 s at 50 MB/s
  std::vector<KvBlockHash> hashes;
  std::vector<Bytes> buffers(kNumBlocks, Bytes(kSize));
  std::vector<std::span<std::byte>> destinations;
  for (int i = 0; i < kNumBlocks; ++i) {
    hashes.push_back(test_hash("paced", i));
    ASSERT_TRUE(store->write_block(hashes.back(), test_payload(kSize, i)));
    destinations.emplace_back(buffers[i]);
  }
  const auto start = std::chrono::steady_clock::now();
  const std::vector<bool> ok = store->read_blocks(hashes, destinations);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(ok, std::vector<bool>(kNumBlocks, true));
  EXPECT_GE(seconds, 0.18);
  EXPECT_GE(store->stats().read_seconds, 0.18);
}

}  // namespace
}  // namespace loom
