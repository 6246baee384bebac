#include "backend/backend.h"

#include "util/error.h"

namespace loom {

void Backend::allocate_residual_cache(const ResidualCacheShape&) {
  throw Error(ErrorKind::kUnsupported, "this backend has no forked (ForkKV) KV sharing",
              "serve forked adapters with --device cpu, or load them with another kv_sharing mode");
}

int64_t Backend::residual_bytes_per_token(int32_t) const { return 0; }

}  // namespace loom
