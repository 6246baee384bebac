// One block file of the disk KV tier (disk_kv_store.h, "Layout" and "File"):
// its name under the directory, its 4096-byte header, and the scan of a
// directory's block files that warm start and the size cap use.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kv/kv_block_hash.h"

namespace loom {

inline constexpr size_t kBlockHeaderBytes = 4096;
inline constexpr uint32_t kBlockFormatVersion = 1;

// DIR/<first 2 hex digits>
std::string block_subdirectory(const std::string& directory, const KvBlockHash& hash);
// DIR/<first 2 hex digits>/<32 hex digits>.kv
std::string block_path(const std::string& directory, const KvBlockHash& hash);
// The hash a file named "<32 lowercase hex digits>.kv" stands for; nullopt for any other name.
std::optional<KvBlockHash> parse_block_file_name(std::string_view name);

uint64_t block_payload_checksum(std::span<const std::byte> payload);
// Fills `header` (kBlockHeaderBytes) for `payload` stored as block `hash`.
void encode_block_header(const KvBlockHash& hash, std::span<const std::byte> payload, std::span<std::byte> header);

struct BlockHeader {
  KvBlockHash hash;
  uint64_t payload_bytes = 0;
  uint64_t payload_checksum = 0;
};
// The header's fields; nullopt when its magic, version or header checksum is wrong.
std::optional<BlockHeader> decode_block_header(std::span<const std::byte> header);

struct BlockFileInfo {
  KvBlockHash hash;
  int64_t bytes = 0;
  timespec modified{};
};
// Every block file under DIR/<2 hex digits>/ (other names are ignored; a file
// another process removes during the scan is skipped).
std::vector<BlockFileInfo> scan_block_files(const std::string& directory);
// Removes the files of DIR/tmp last modified more than `max_age_seconds` ago
// (left by writers that died mid-write); returns how many.
int remove_stale_temporary_files(const std::string& directory, int64_t max_age_seconds);

}  // namespace loom
