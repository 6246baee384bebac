// Cryptographic primitives of the KV link's authentication (kv_link_session.h)
// and of the signed /loom/kv/* HTTP calls (server/kv_auth.h): SHA-256,
// HMAC-SHA256, random bytes and a constant-time comparison, all from
// OpenSSL's libcrypto (Debian's libssl-dev), nothing hand-rolled.
//
// Thread: every function may run on any thread at once.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

namespace loom::kvlink {

using Digest = std::array<std::byte, 32>;  // a SHA-256 digest or an HMAC-SHA256 tag

// SHA-256 of `bytes`.
Digest sha256(std::span<const std::byte> bytes);

// HMAC-SHA256 under `key` (any length, empty included) of the concatenated `parts`.
Digest hmac_sha256(std::span<const std::byte> key, std::initializer_list<std::span<const std::byte>> parts);

// Fills `bytes` from the operating system's CSPRNG (OpenSSL's RAND_bytes).
// Throws Error(kInternal) when it cannot (never expected on Linux).
void random_bytes(std::span<std::byte> bytes);

// Whether a and b hold the same bytes; for equal sizes the time does not depend on where they differ.
bool constant_time_equal(std::span<const std::byte> a, std::span<const std::byte> b);

// Lower-case hex of `bytes`.
std::string to_hex(std::span<const std::byte> bytes);

inline std::span<const std::byte> as_bytes(std::string_view text) { return std::as_bytes(std::span(text)); }

}  // namespace loom::kvlink
