// The KV link's wire format (kvtransfer/), protocol 2: how one engine pushes
// KV blocks to another over TCP (DualPath's PE <-> DE transfers between CPU
// engines, or between GPU engines through their host buffers), authenticated
// by a secret both engines share (kv_link_session.h).
//
// A connection starts with the handshake (kv_link_session.h): the client's
// magic "LOOMKVL2" and nonce, the server's magic, nonce and proof, the
// client's proof, the server's verdict byte. Protocol 1 ("LOOMKVL1", no
// authentication) is refused: its magic closes the connection at once.
// Then the client sends requests, each a sealed message (kv_link_session.h:
// u32 length, body, HMAC tag under the session key with a per-direction
// counter) whose body starts with the op; each is answered by a sealed
// message before the next request:
//
//   'H' (have)  u32 n, then n block hashes (16 bytes each: high, low)
//               -> n bytes, 1 where the server's buffer or its engine's caches
//               (device, host tier) hold the block (its storage does not count:
//               reading it there is the transfer's alternative)
//   'P' (put)   u32 n, then n block headers, each: hash (16), u64 payload
//               bytes, the payload's SHA-256 (32). The n payloads follow the
//               message raw on the connection, in order
//               -> u32: blocks stored (a block whose payload does not match its
//               digest is dropped)
//   'C' (channel) a data plane's name (kv_data_plane.h, <= 64 bytes)
//               -> 1 byte: 1 when the server has that plane and joins; then
//               the plane's own handshake follows raw on the connection. 0: it
//               has none, and the connection goes on with inline puts.
//   'B' (bulk put) as 'P', but the payloads cross through the connection's
//               channel, in order -> u32: blocks stored. Only after a channel.
//
// Payloads are not sealed themselves: their digests are, in the header
// message, and the receiver checks each payload against its digest before it
// enters the buffer, so a changed byte anywhere is caught (a plane's raw
// handshake needs no seal: what it carries is checked the same way).
//
// Integers are little-endian. Caps: n <= kMaxBlocksPerRequest, a payload <=
// kMaxPayloadBytes, a 'B' request's payloads <= kMaxBulkRequestBytes, a
// message <= kMaxMessageBytes; a request over a cap, an unknown op, a bad
// magic, a failed handshake or a message whose tag fails closes the
// connection. A block enters the receiver's buffer only once its whole
// payload arrived and verified, so a sender that dies mid-transfer leaves
// whole blocks or nothing.
#pragma once

#include <cstddef>
#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kv/kv_block_hash.h"

namespace loom::kvlink {

inline constexpr char kMagic[8] = {'L', 'O', 'O', 'M', 'K', 'V', 'L', '2'};
inline constexpr char kMagicVersion1[8] = {'L', 'O', 'O', 'M', 'K', 'V', 'L', '1'};
inline constexpr char kOpHave = 'H';
inline constexpr char kOpPut = 'P';
inline constexpr char kOpChannel = 'C';
inline constexpr char kOpBulkPut = 'B';
inline constexpr uint32_t kMaxPlaneNameBytes = 64;
inline constexpr uint32_t kMaxBlocksPerRequest = 1u << 20;
inline constexpr uint64_t kMaxPayloadBytes = 256ull << 20;
inline constexpr uint64_t kMaxBulkRequestBytes = 1ull << 30;  // a 'B' request's payloads together
inline constexpr size_t kBlockHeaderBytes = 16 + 8 + 32;      // hash, size, SHA-256
inline constexpr uint32_t kMaxMessageBytes = 1 + 4 + kBlockHeaderBytes * kMaxBlocksPerRequest;

// Blocking socket I/O; false when the peer closed or an error / timeout hit.
bool read_exact(int fd, std::span<std::byte> bytes);
bool write_all(int fd, std::span<const std::byte> bytes);
// Sets send and receive timeouts on a socket.
void set_timeouts(int fd, double seconds);

// A message body being written: little-endian integers, hashes and raw bytes appended.
struct MessageWriter {
  std::vector<std::byte> bytes;
  MessageWriter& op(char code);
  MessageWriter& u32(uint32_t value);
  MessageWriter& u64(uint64_t value);
  MessageWriter& hash(const KvBlockHash& value);
  MessageWriter& raw(std::span<const std::byte> value);
};

// A received message body read front to back; each read is false (and reads
// nothing) past the end.
class MessageReader {
 public:
  explicit MessageReader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  bool u8(uint8_t& value);
  bool u32(uint32_t& value);
  bool u64(uint64_t& value);
  bool hash(KvBlockHash& value);
  bool raw(std::span<std::byte> value);
  size_t remaining() const { return bytes_.size() - at_; }

 private:
  std::span<const std::byte> bytes_;
  size_t at_ = 0;
};

// A TCP socket for host:port: tries each address getaddrinfo gives (passive:
// for binding) until `use(fd, address, length)` accepts one (it binds and
// listens, or connects). Returns that fd, or -1 with `failure` saying why
// (the resolver's error or the last attempt's errno text).
int open_socket(const std::string& host, int port, bool passive,
                const std::function<bool(int fd, const sockaddr* address, socklen_t length)>& use, std::string& failure);

// "host:port" -> (host, port). Throws Error(kInvalidArgument) naming `address`.
std::pair<std::string, int> split_address(const std::string& address);

// Whether a socket address is a loopback one (127.0.0.0/8, ::1, or ::ffff:127.x.y.z).
bool is_loopback(const sockaddr* address);

// A listening socket on host:port (0: a free port) for a KV endpoint named
// `what` ("KV link", "device KV plane socket"), and the port it got. Throws
// Error(kInvalidArgument) when it cannot listen (hint: `port_hint`), or when
// the address is not loopback and there is no secret (has_secret false): any
// host that reaches it could write KV blocks other requests then read.
struct Listener {
  int fd = -1;
  int port = 0;
};
Listener listen_for_kv(const std::string& host, int port, bool has_secret, const std::string& what,
                       const std::string& port_hint);

// The next connection on `listen_fd` (SOCK_CLOEXEC), riding out EINTR,
// ECONNABORTED and descriptor exhaustion; -1 once `stopping` is set or the
// listening socket is gone.
int accept_connection(int listen_fd, const std::atomic<bool>& stopping);

}  // namespace loom::kvlink
