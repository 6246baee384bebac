#include "kvtransfer/device/socket/socket_device_kv_wire.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "kvtransfer/device/device_kv_runs.h"
#include "kvtransfer/kv_link_crypto.h"
#include "util/error.h"

namespace loom::socket_plane_wire {

// Bytes one block contributes to one layer piece: every array of the layer, main then rCache.
int64_t piece_block_bytes(int64_t main_arrays, int64_t main_bytes, int64_t residual_arrays, int64_t residual_bytes) {
  return main_arrays * main_bytes + residual_arrays * residual_bytes;
}

bool ids_in_pool(std::span<const int32_t> ids, const KvPoolMemory& pool) {
  for (int32_t id : ids)
    if (id < 0 || id >= pool.num_blocks) return false;
  return true;
}

// Appends layer `layer` of blocks `ids` of `pool`, array after array, to `out`.
void append_layer(const KvPoolMemory& pool, int32_t layer, std::span<const int32_t> ids, std::vector<std::byte>& out) {
  const int64_t bytes = pool.bytes_per_block;
  std::vector<int32_t> positions(ids.size());
  std::iota(positions.begin(), positions.end(), 0);
  for (int32_t a = 0; a < pool.arrays_per_layer; ++a) {
    const std::byte* base = pool.arrays[static_cast<size_t>(layer) * pool.arrays_per_layer + a];
    const size_t at = out.size();
    out.resize(at + ids.size() * static_cast<size_t>(bytes));
    for (const DeviceKvBlockRun& run : coalesce_block_runs(ids, positions))
      std::memcpy(out.data() + at + run.destination * bytes, base + run.source * bytes,
                  static_cast<size_t>(run.count * bytes));
  }
}

// Copies `payload` (layer `layer` of `count` blocks, array after array) into blocks `destinations` of `pool`;
// returns the bytes used.
size_t scatter_layer(const KvPoolMemory& pool, int32_t layer, std::span<const int32_t> destinations,
                     const std::byte* payload) {
  const int64_t bytes = pool.bytes_per_block;
  std::vector<int32_t> positions(destinations.size());
  std::iota(positions.begin(), positions.end(), 0);
  const std::vector<DeviceKvBlockRun> runs = coalesce_block_runs(positions, destinations);
  size_t used = 0;
  for (int32_t a = 0; a < pool.arrays_per_layer; ++a) {
    std::byte* base = pool.arrays[static_cast<size_t>(layer) * pool.arrays_per_layer + a];
    for (const DeviceKvBlockRun& run : runs)
      std::memcpy(base + run.destination * bytes, payload + used + run.source * bytes,
                  static_cast<size_t>(run.count * bytes));
    used += destinations.size() * static_cast<size_t>(bytes);
  }
  return used;
}

std::vector<std::byte> write_open(const DeviceKvDestination& destination, int32_t num_layers, const KvPoolMemory& main,
                                  const KvPoolMemory& residual, const std::string& sender) {
  const bool forked = !destination.residual_blocks.empty();
  kvlink::MessageWriter open;
  open.op(kOpOpen).u64(destination.id).u32(static_cast<uint32_t>(num_layers))
      .u32(static_cast<uint32_t>(destination.num_blocks())).u32(static_cast<uint32_t>(main.arrays_per_layer))
      .u64(static_cast<uint64_t>(main.bytes_per_block)).u32(forked ? residual.arrays_per_layer : 0)
      .u64(forked ? static_cast<uint64_t>(residual.bytes_per_block) : 0)
      .raw(kvlink::as_bytes(sender));
  return std::move(open.bytes);
}

bool read_open(std::span<const std::byte> body, OpenRequest& open) {
  kvlink::MessageReader reader(body);
  uint8_t op = 0;
  if (!reader.u8(op) || op != static_cast<uint8_t>(kOpOpen) || !reader.u64(open.id) || !reader.u32(open.layers) ||
      !reader.u32(open.blocks) || !reader.u32(open.main_arrays) || !reader.u64(open.main_bytes) ||
      !reader.u32(open.residual_arrays) || !reader.u64(open.residual_bytes) || reader.remaining() > kMaxAddressBytes)
    return false;
  open.sender = text_of(reader);
  return true;
}

std::string open_mismatch(const OpenRequest& open, int32_t num_layers, const DeviceKvDestination& destination,
                          const KvPoolMemory& main, const KvPoolMemory& residual) {
  const bool forked = !destination.residual_blocks.empty();
  if (static_cast<int32_t>(open.layers) != num_layers || static_cast<int32_t>(open.blocks) != destination.num_blocks())
    return fmt::format("the sender has {} layers x {} blocks, the reservation {} x {}", open.layers, open.blocks,
                       num_layers, destination.num_blocks());
  if (static_cast<int32_t>(open.main_arrays) != main.arrays_per_layer ||
      static_cast<int64_t>(open.main_bytes) != main.bytes_per_block ||
      (forked && (static_cast<int32_t>(open.residual_arrays) != residual.arrays_per_layer ||
                  static_cast<int64_t>(open.residual_bytes) != residual.bytes_per_block)) ||
      (!forked && open.residual_arrays != 0))
    return "the engines lay a block out differently (model, dtype, block size, adapter rank or tensor-parallel "
           "size differ)";
  return "";
}

std::string open_refusal(const OpenRequest& open, const std::string& expected_peer, bool opened, int32_t num_layers,
                         const DeviceKvDestination& destination, const KvPoolMemory& main,
                         const KvPoolMemory& residual) {
  if (expected_peer != open.sender)
    return fmt::format("transfer {} is expected from {}, not {}", open.id, expected_peer, open.sender);
  if (opened) return "the transfer was opened before (one connection per transfer)";
  return open_mismatch(open, num_layers, destination, main, residual);
}

bool can_send(const KvPoolMemory& main, const KvPoolMemory& residual, int32_t num_layers,
              const DeviceKvDestination& destination) {
  return !main.empty() && main.num_layers() == num_layers &&
         (destination.residual_blocks.empty() || !residual.empty());
}

void check_destination(const DeviceKvDestination& destination, const KvPoolMemory& main,
                       const KvPoolMemory& residual) {
  const bool forked = !destination.residual_blocks.empty();
  if (!ids_in_pool(destination.main_blocks, main) ||
      (forked && (destination.residual_blocks.size() != destination.main_blocks.size() ||
                  !ids_in_pool(destination.residual_blocks, residual))))
    fail(ErrorKind::kInvalidArgument, "device KV transfer {}: block ids outside the bound pools", destination.id);
}

std::optional<kvlink::Session> receive_open(int fd, const std::string& secret, double io_timeout_seconds,
                                            const std::string& plane, int port, OpenRequest& open, bool& refused) {
  refused = false;
  kvlink::set_timeouts(fd, std::min(kHandshakeTimeoutSeconds, io_timeout_seconds));
  kvlink::HandshakeFailure handshake = kvlink::HandshakeFailure::kNone;
  std::optional<kvlink::Session> session = kvlink::server_handshake(fd, secret, handshake);
  if (!session) {
    refused = true;
    spdlog::warn("device KV plane {} on port {}: refused a connection: {}", plane, port,
                 kvlink::handshake_failure_text(handshake));
    return std::nullopt;
  }
  kvlink::set_timeouts(fd, io_timeout_seconds);
  std::vector<std::byte> body;
  if (session->receive(fd, body, kMaxControlBytes) != kvlink::Session::Received::kOk || !read_open(body, open))
    return std::nullopt;
  return session;
}

bool peer_allowed(const KvPeerAllowlist& peers, const std::string& peer, DeviceKvTransferId id) {
  if (peers.allows(peer)) return true;
  spdlog::warn("device KV transfer {}: {} is not an allowed peer ({}): not sent", id, peer, peers.describe());
  return false;
}

std::string text_of(kvlink::MessageReader& reader) {
  std::string text(reader.remaining(), '\0');
  reader.raw(std::as_writable_bytes(std::span(text)));
  return text;
}

std::vector<std::byte> control(char op, uint8_t flag, const std::string& text) {
  kvlink::MessageWriter writer;
  writer.op(op);
  writer.bytes.push_back(std::byte{flag});
  writer.raw(kvlink::as_bytes(text));
  return std::move(writer.bytes);
}

// The answer to an open: u8 accepted, then the reason.
std::vector<std::byte> verdict(bool accepted, const std::string& reason) {
  kvlink::MessageWriter writer;
  writer.bytes.push_back(std::byte{accepted ? uint8_t{1} : uint8_t{0}});
  writer.raw(kvlink::as_bytes(reason));
  return std::move(writer.bytes);
}

}  // namespace loom::socket_plane_wire
