#include "util/error.h"

namespace loom {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument: return "invalid_argument";
    case ErrorKind::kNotFound: return "not_found";
    case ErrorKind::kFormat: return "format_error";
    case ErrorKind::kUnsupported: return "unsupported";
    case ErrorKind::kCapacity: return "capacity";
    case ErrorKind::kCancelled: return "cancelled";
    case ErrorKind::kUnavailable: return "unavailable";
    case ErrorKind::kInternal: return "internal";
  }
  return "unknown";
}

}  // namespace loom
