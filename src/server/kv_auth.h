// Signed calls to an engine's /loom/kv/* routes: with a KV transfer secret
// (--kv-transfer-secret-file), an engine answers them only with the header
//
//   X-Loom-KV-Auth: 1 SECONDS HMAC
//
// where SECONDS is the caller's Unix time and HMAC the lower-case hex of
// HMAC-SHA256(secret, "loom kv http 1\n" METHOD "\n" PATH "\n" SECONDS "\n"
// hex(SHA-256(body))). The secret itself never crosses the wire; a signature
// is good for one method, path and body, within kKvAuthMaxSkewSeconds of the
// engine's clock (a captured call can be replayed within that window only:
// probe and status only read, and a replayed send pushes the same blocks to
// the same allowed peer, which skips those it holds). `loom router` signs
// every call it makes to /loom/kv/*; this is separate from --api-key, which
// still applies on top.
//
// Thread: any (pure functions).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace loom::server {

inline constexpr const char* kKvAuthHeader = "X-Loom-KV-Auth";
inline constexpr int64_t kKvAuthMaxSkewSeconds = 300;

// The header's value for one call at `unix_seconds`.
std::string sign_kv_request(std::string_view secret, std::string_view method, std::string_view path,
                            std::string_view body, int64_t unix_seconds);
// Whether `header_value` signs this call under `secret`, within the skew of
// `now_seconds` (the tag compared in constant time).
bool kv_request_signed(std::string_view secret, std::string_view method, std::string_view path, std::string_view body,
                       std::string_view header_value, int64_t now_seconds);
// The current Unix time in seconds.
int64_t unix_seconds_now();

}  // namespace loom::server
