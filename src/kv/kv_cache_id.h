// Which member of a KvCacheGroup (kv_cache_group.h) a cache is: the main
// cache, or ForkKV's residual cache (the forked adapters' rCache).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace loom {

enum class KvCacheId : uint8_t { kMain = 0, kResidual = 1 };
inline constexpr size_t kNumKvCaches = 2;
inline constexpr std::array<KvCacheId, kNumKvCaches> kAllKvCaches{KvCacheId::kMain, KvCacheId::kResidual};
const char* kv_cache_name(KvCacheId id);  // "main", "residual"

}  // namespace loom
