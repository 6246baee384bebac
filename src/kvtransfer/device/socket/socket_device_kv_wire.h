// The socket device KV plane's wire format (socket_device_kv_plane.h
// describes the messages): op codes, size limits, and the layout of a layer
// piece's payload, shared by the sending (socket_device_kv_sender.cc) and
// the receiving (socket_device_kv_receiver.cc) half. Pure functions over
// bytes; no state, any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvtransfer/device/device_kv_plane.h"
#include "kvtransfer/kv_link_protocol.h"

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
// The rest of `reader`'s message as text.
std::string text_of(kvlink::MessageReader& reader);
// A control message: op, u8 flag, then text ('E' end).
std::vector<std::byte> control(char op, uint8_t flag, const std::string& text);
// The answer to an open: u8 accepted, then the reason.
std::vector<std::byte> verdict(bool accepted, const std::string& reason);

}  // namespace loom::socket_plane_wire
