// The KV link's authentication (protocol 2, kv_link_protocol.h): a
// challenge-response handshake over a secret both engines share
// (--kv-transfer-secret-file), then sealed messages.
//
// Handshake, on a fresh connection (K: the shared secret, any length; empty
// when neither engine has one, which `loom serve` allows on loopback only):
//   client -> server  "LOOMKVL2", Nc (32 random bytes)
//   server -> client  "LOOMKVL2", Ns (32 random bytes), HMAC(K, "loom kv link 2 server" | Nc | Ns)
//   client -> server  HMAC(K, "loom kv link 2 client" | Nc | Ns)
//   server -> client  1 byte: 1 accepted, 0 refused (then it closes)
// Each side checks the other's proof in constant time before anything else
// crosses: a peer without K cannot pass, and neither can one that replays a
// recorded handshake (the other side's nonce is fresh). The session key is
// HMAC(K, "loom kv link 2 session" | Nc | Ns).
//
// A sealed message: u32 length, the body, and the tag HMAC(session key,
// direction ('C' client -> server, 'S' back) | u64 counter | u32 length | body),
// the counter counting that direction's messages from 0 and never sent: a
// message replayed, reordered, dropped, reflected or changed fails its tag,
// and the receiver closes the connection.
//
// Thread: a Session belongs to one connection, used by one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtransfer/kv_link_crypto.h"

namespace loom::kvlink {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kTagBytes = 32;
// What each side writes during the handshake, in bytes (tests place a byte by them).
inline constexpr size_t kClientHelloBytes = 8 + kNonceBytes;
inline constexpr size_t kClientHandshakeBytes = kClientHelloBytes + kTagBytes;
inline constexpr size_t kMessageOverheadBytes = 4 + kTagBytes;  // around each body

class Session {
 public:
  enum class Side { kClient, kServer };
  Session(const Digest& key, Side side) : key_(key), side_(side) {}

  // Writes `body` sealed; false when the socket failed.
  bool send(int fd, std::span<const std::byte> body);
  enum class Received { kOk, kClosed, kForged };
  // Reads one sealed message into `body`. kClosed: the peer closed, timed out
  // or announced more than `max_bytes`; kForged: the tag failed. Either way the
  // connection must be closed.
  Received receive(int fd, std::vector<std::byte>& body, uint32_t max_bytes);

 private:
  Digest tag(char direction, uint64_t counter, std::span<const std::byte> length,
             std::span<const std::byte> body) const;
  Digest key_;
  Side side_;
  uint64_t sent_ = 0, received_ = 0;
};

// Why a server refused a connection at its handshake.
enum class HandshakeFailure {
  kNone,
  kClosed,       // the peer closed or timed out mid-handshake
  kVersion1,     // an older Loom: protocol 1's magic
  kNotALink,     // another magic: not a KV link client at all
  kWrongProof,   // the peer does not hold the secret (or replayed a handshake)
};
const char* handshake_failure_text(HandshakeFailure failure);

// Client side, on a connected socket. nullopt with `failure` saying why: the
// peer closed (an older Loom, or not a KV link), did not prove the secret, or
// refused this side's proof.
std::optional<Session> client_handshake(int fd, std::string_view secret, std::string& failure);
// Server side, on an accepted socket. nullopt with `failure` set when refused
// (the client was told so when it got that far).
std::optional<Session> server_handshake(int fd, std::string_view secret, HandshakeFailure& failure);

}  // namespace loom::kvlink
