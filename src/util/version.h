// Loom's version (GET /version, `loom --version`, the system fingerprint).
#pragma once

namespace loom {

inline constexpr const char* kLoomVersion = "0.1.0";

}  // namespace loom
