// The KV link's wire format (kvtransfer/): how one engine pushes KV blocks to
// another over TCP (DualPath's PE <-> DE transfers between CPU engines, or
// between GPU engines through their host buffers).
//
// A connection starts with the client's 8-byte magic "LOOMKVL1"; then the
// client sends requests, each answered before the next:
//
//   'H' (have)  u32 n, then n block hashes (16 bytes each: high, low)
//               -> n bytes, 1 where the server's buffer or its engine's caches
//               (device, host tier) hold the block (its storage does not count:
//               reading it there is the transfer's alternative)
//   'P' (put)   u32 n, then n blocks, each: hash (16), u64 payload bytes,
//               u64 XXH3-64 of the payload, the payload
//               -> u32: blocks stored (a block whose checksum fails is dropped)
//   'C' (channel) u32 length, a data plane's name (kv_data_plane.h, <= 64 bytes)
//               -> 1 byte: 1 when the server has that plane and joins; then
//               the plane's own handshake follows on the connection. 0: it
//               has none, and the connection goes on with inline puts.
//   'B' (bulk put) u32 n, then n block headers as in 'P' without the payloads;
//               the payloads then cross through the connection's channel, in
//               order -> u32: blocks stored. Only after a channel was set up.
//
// Integers are little-endian. Caps: n <= kMaxBlocksPerRequest, a payload <=
// kMaxPayloadBytes, a 'B' request's payloads <= kMaxBulkRequestBytes; a request over a cap, an unknown op or a bad magic closes
// the connection. A block enters the receiver's buffer only once its whole
// payload arrived and verified, so a sender that dies mid-transfer leaves
// whole blocks or nothing.
#pragma once

#include <cstddef>
#include <sys/socket.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>

#include "kv/kv_block_hash.h"

namespace loom::kvlink {

inline constexpr char kMagic[8] = {'L', 'O', 'O', 'M', 'K', 'V', 'L', '1'};
inline constexpr char kOpHave = 'H';
inline constexpr char kOpPut = 'P';
inline constexpr char kOpChannel = 'C';
inline constexpr char kOpBulkPut = 'B';
inline constexpr uint32_t kMaxPlaneNameBytes = 64;
inline constexpr uint32_t kMaxBlocksPerRequest = 1u << 20;
inline constexpr uint64_t kMaxPayloadBytes = 256ull << 20;
inline constexpr uint64_t kMaxBulkRequestBytes = 1ull << 30;  // a 'B' request's payloads together

// Blocking socket I/O; false when the peer closed or an error / timeout hit.
bool read_exact(int fd, std::span<std::byte> bytes);
bool write_all(int fd, std::span<const std::byte> bytes);
bool write_u32(int fd, uint32_t value);
bool write_u64(int fd, uint64_t value);
bool read_u32(int fd, uint32_t& value);
bool read_u64(int fd, uint64_t& value);
bool write_hash(int fd, const KvBlockHash& hash);
bool read_hash(int fd, KvBlockHash& hash);
// Sets send and receive timeouts on a socket.
void set_timeouts(int fd, double seconds);

// A TCP socket for host:port: tries each address getaddrinfo gives (passive:
// for binding) until `use(fd, address, length)` accepts one (it binds and
// listens, or connects). Returns that fd, or -1 with `failure` saying why
// (the resolver's error or the last attempt's errno text).
int open_socket(const std::string& host, int port, bool passive,
                const std::function<bool(int fd, const sockaddr* address, socklen_t length)>& use, std::string& failure);

// "host:port" -> (host, port). Throws Error(kInvalidArgument) naming `address`.
std::pair<std::string, int> split_address(const std::string& address);

}  // namespace loom::kvlink
