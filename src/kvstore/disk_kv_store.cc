#include "kvstore/disk_kv_store.h"

#include "util/error.h"

namespace loom {

std::unique_ptr<DiskKvStore> DiskKvStore::open(const DiskKvStoreConfig& config) {
  fail(ErrorKind::kUnsupported, "disk KV tier at {}: not built yet", config.directory);
}

}  // namespace loom
