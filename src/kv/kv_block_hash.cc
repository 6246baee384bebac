#include "kv/kv_block_hash.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <array>
#include <cstring>

#include <fmt/format.h>

namespace loom {

namespace {

KvBlockHash from_xxh(const XXH128_hash_t& hash) { return {hash.high64, hash.low64}; }

}  // namespace

std::string KvBlockHash::hex() const { return fmt::format("{:016x}{:016x}", high, low); }

KvBlockHash hash_bytes(std::span<const std::byte> bytes) {
  return from_xxh(XXH3_128bits(bytes.data(), bytes.size()));
}

KvBlockHash hash_string(std::string_view text) { return from_xxh(XXH3_128bits(text.data(), text.size())); }

KvBlockHash hash_combine(const KvBlockHash& first, const KvBlockHash& second) {
  const std::array<uint64_t, 4> words{first.high, first.low, second.high, second.low};
  return from_xxh(XXH3_128bits(words.data(), sizeof(words)));
}

KvBlockHash chain_block_hash(const KvBlockHash& parent_or_salt, const KvBlockHash& namespace_salt,
                             std::span<const int32_t> tokens) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  const std::array<uint64_t, 4> words{parent_or_salt.high, parent_or_salt.low, namespace_salt.high,
                                      namespace_salt.low};
  XXH3_128bits_update(&state, words.data(), sizeof(words));
  XXH3_128bits_update(&state, tokens.data(), tokens.size_bytes());
  return from_xxh(XXH3_128bits_digest(&state));
}

}  // namespace loom
