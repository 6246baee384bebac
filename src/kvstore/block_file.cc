#include "kvstore/block_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <xxhash.h>

#include <charconv>
#include <cstring>
#include <ctime>

#include <fmt/format.h>

namespace loom {

namespace {

constexpr char kMagic[8] = {'L', 'O', 'O', 'M', 'K', 'V', '0', '1'};
constexpr size_t kChecksummedHeaderBytes = 48;

// Header fields are little-endian, as x86 and arm64 store integers.
template <typename T>
void store(std::span<std::byte> header, size_t offset, T value) {
  std::memcpy(header.data() + offset, &value, sizeof(value));
}

template <typename T>
T load(std::span<const std::byte> header, size_t offset) {
  T value;
  std::memcpy(&value, header.data() + offset, sizeof(value));
  return value;
}

std::optional<uint64_t> parse_hex64(std::string_view digits) {
  uint64_t value = 0;
  for (char digit : digits) {
    if (!(digit >= '0' && digit <= '9') && !(digit >= 'a' && digit <= 'f')) return std::nullopt;
  }
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value, 16);
  if (error != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return value;
}

// Calls visit(dirfd, name) for each entry of `path` but "." and ".."; nothing when it cannot be opened.
template <typename Visit>
void for_each_entry(const std::string& path, Visit&& visit) {
  DIR* directory = ::opendir(path.c_str());
  if (directory == nullptr) return;
  while (const dirent* entry = ::readdir(directory)) {
    const std::string_view name = entry->d_name;
    if (name == "." || name == "..") continue;
    visit(::dirfd(directory), entry->d_name);
  }
  ::closedir(directory);
}

}  // namespace

std::string block_subdirectory(const std::string& directory, const KvBlockHash& hash) {
  return fmt::format("{}/{:02x}", directory, hash.high >> 56);
}

std::string block_path(const std::string& directory, const KvBlockHash& hash) {
  return fmt::format("{}/{:02x}/{}.kv", directory, hash.high >> 56, hash.hex());
}

std::optional<KvBlockHash> parse_block_file_name(std::string_view name) {
  if (name.size() != 35 || !name.ends_with(".kv")) return std::nullopt;
  const std::optional<uint64_t> high = parse_hex64(name.substr(0, 16));
  const std::optional<uint64_t> low = parse_hex64(name.substr(16, 16));
  if (!high || !low) return std::nullopt;
  return KvBlockHash{*high, *low};
}

uint64_t block_payload_checksum(std::span<const std::byte> payload) {
  return XXH3_64bits(payload.data(), payload.size());
}

void encode_block_header(const KvBlockHash& hash, std::span<const std::byte> payload, std::span<std::byte> header) {
  std::memset(header.data(), 0, kBlockHeaderBytes);
  std::memcpy(header.data(), kMagic, sizeof(kMagic));
  store<uint32_t>(header, 8, kBlockFormatVersion);
  store<uint64_t>(header, 16, hash.high);
  store<uint64_t>(header, 24, hash.low);
  store<uint64_t>(header, 32, payload.size());
  store<uint64_t>(header, 40, block_payload_checksum(payload));
  store<uint64_t>(header, 48, XXH3_64bits(header.data(), kChecksummedHeaderBytes));
}

std::optional<BlockHeader> decode_block_header(std::span<const std::byte> header) {
  if (header.size() < kBlockHeaderBytes || std::memcmp(header.data(), kMagic, sizeof(kMagic)) != 0) return std::nullopt;
  if (load<uint32_t>(header, 8) != kBlockFormatVersion) return std::nullopt;
  if (load<uint64_t>(header, 48) != XXH3_64bits(header.data(), kChecksummedHeaderBytes)) return std::nullopt;
  return BlockHeader{{load<uint64_t>(header, 16), load<uint64_t>(header, 24)},
                     load<uint64_t>(header, 32),
                     load<uint64_t>(header, 40)};
}

std::vector<BlockFileInfo> scan_block_files(const std::string& directory) {
  std::vector<BlockFileInfo> files;
  for (int prefix = 0; prefix < 256; ++prefix) {
    for_each_entry(fmt::format("{}/{:02x}", directory, prefix), [&](int directory_fd, const char* name) {
      const std::optional<KvBlockHash> hash = parse_block_file_name(name);
      struct stat info {};
      if (!hash || ::fstatat(directory_fd, name, &info, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(info.st_mode)) return;
      files.push_back({*hash, static_cast<int64_t>(info.st_size), info.st_mtim});
    });
  }
  return files;
}

int remove_stale_temporary_files(const std::string& directory, int64_t max_age_seconds) {
  const time_t cutoff = std::time(nullptr) - max_age_seconds;
  int num_removed = 0;
  for_each_entry(directory + "/tmp", [&](int directory_fd, const char* name) {
    struct stat info {};
    if (::fstatat(directory_fd, name, &info, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(info.st_mode)) return;
    if (info.st_mtim.tv_sec < cutoff && ::unlinkat(directory_fd, name, 0) == 0) ++num_removed;
  });
  return num_removed;
}

}  // namespace loom
