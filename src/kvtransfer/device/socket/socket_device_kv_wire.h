// The socket device KV plane's wire format (socket_device_kv_plane.h
// describes the messages): op codes, size limits, and the layout of a layer
// piece's payload, shared by the sending (socket_device_kv_sender.cc) and
// the receiving (socket_device_kv_receiver.cc) half. Pure functions over
// bytes; no state, any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvtransfer/device/device_kv_plane.h"
#include "kvtransfer/kv_link_protocol.h"
#include "kvtransfer/kv_link_session.h"
#include "kvtransfer/kv_peer_allowlist.h"

namespace loom::socket_plane_wire {

constexpr char kOpOpen = 'O';
constexpr char kOpLayer = 'L';
constexpr char kOpEnd = 'E';
constexpr uint32_t kMaxControlBytes = 4096;   // an open, its answer, an end
constexpr size_t kMaxAddressBytes = 256;      // the sender's address in an open
constexpr size_t kLayerHeaderBytes = 1 + 4 + 4 + 4;  // 'L', layer, first block, count
constexpr double kHandshakeTimeoutSeconds = 5.0;

// Bytes one block contributes to one layer piece: every array of the layer, main then rCache.
int64_t piece_block_bytes(int64_t main_arrays, int64_t main_bytes, int64_t residual_arrays, int64_t residual_bytes);
// Whether every id names a block of `pool`.
bool ids_in_pool(std::span<const int32_t> ids, const KvPoolMemory& pool);
// Appends layer `layer` of blocks `ids` of `pool`, array after array, to `out`.
void append_layer(const KvPoolMemory& pool, int32_t layer, std::span<const int32_t> ids, std::vector<std::byte>& out);
// Copies `payload` (layer `layer` of `destinations.size()` blocks, array after array) into blocks
// `destinations` of `pool`; returns the bytes used.
size_t scatter_layer(const KvPoolMemory& pool, int32_t layer, std::span<const int32_t> destinations,
                     const std::byte* payload);
// An 'O' open's fields (socket_device_kv_plane.h "Wire"): the transfer, its size and block layout, the sender.
struct OpenRequest {
  uint64_t id = 0;
  uint32_t layers = 0, blocks = 0, main_arrays = 0, residual_arrays = 0;
  uint64_t main_bytes = 0, residual_bytes = 0;
  std::string sender;  // the sender's endpoint address
};
// The open of transfer `destination` (num_layers layers) laid out as `main` (and `residual`, forked), from `sender`.
std::vector<std::byte> write_open(const DeviceKvDestination& destination, int32_t num_layers, const KvPoolMemory& main,
                                  const KvPoolMemory& residual, const std::string& sender);
// false: not a well-formed open.
bool read_open(std::span<const std::byte> body, OpenRequest& open);
// Why `open` does not fit a reservation of `destination` (num_layers layers) in pools laid out as `main` /
// `residual`; "" when it fits.
std::string open_mismatch(const OpenRequest& open, int32_t num_layers, const DeviceKvDestination& destination,
                          const KvPoolMemory& main, const KvPoolMemory& residual);
// Why a receiver refuses `open` for a transfer it expects from `expected_peer` (`opened`: a connection opened it
// before) into `destination`; "" when it accepts.
std::string open_refusal(const OpenRequest& open, const std::string& expected_peer, bool opened, int32_t num_layers,
                         const DeviceKvDestination& destination, const KvPoolMemory& main,
                         const KvPoolMemory& residual);
// Whether pools `main` / `residual` can send a transfer of num_layers layers into `destination` (begin_send's check).
bool can_send(const KvPoolMemory& main, const KvPoolMemory& residual, int32_t num_layers,
              const DeviceKvDestination& destination);
// Throws Error(kInvalidArgument) when a destination block is outside the bound pools (expect()'s check).
void check_destination(const DeviceKvDestination& destination, const KvPoolMemory& main,
                       const KvPoolMemory& residual);
// A plane connection's start at the receiver: the KV link's handshake over `secret` (a peer that fails it:
// `refused` set and logged, naming `plane` and `port`), then the sealed 'O' open into `open`; I/O timeouts of
// io_timeout_seconds afterwards. nullopt: the connection must close (refused, closed, not an open).
std::optional<kvlink::Session> receive_open(int fd, const std::string& secret, double io_timeout_seconds,
                                            const std::string& plane, int port, OpenRequest& open, bool& refused);
// Whether `peers` lets transfer `id` go to `peer`; logs the refusal.
bool peer_allowed(const KvPeerAllowlist& peers, const std::string& peer, DeviceKvTransferId id);
// The rest of `reader`'s message as text.
std::string text_of(kvlink::MessageReader& reader);
// A control message: op, u8 flag, then text ('E' end).
std::vector<std::byte> control(char op, uint8_t flag, const std::string& text);
// The answer to an open: u8 accepted, then the reason.
std::vector<std::byte> verdict(bool accepted, const std::string& reason);

}  // namespace loom::socket_plane_wire
