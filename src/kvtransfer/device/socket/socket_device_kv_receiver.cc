// The socket plane's receiving half (DE): expectations, progress, finish,
// the listener's accept loop and the thread per incoming connection
// (socket_device_kv_plane.h).
#include "kvtransfer/device/socket/socket_device_kv_plane.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "kvtransfer/device/socket/socket_device_kv_wire.h"
#include "kvtransfer/kv_link_protocol.h"
#include "kvtransfer/kv_link_session.h"
#include "util/error.h"

namespace loom {

using namespace socket_plane_wire;  // NOLINT(google-build-using-namespace): this file speaks the wire format

void SocketDeviceKvPlane::expect(const DeviceKvExpectation& expectation) {
  std::lock_guard lock(mutex_);
  const DeviceKvDestination& destination = expectation.destination;
  if (incoming_.count(destination.id))
    fail(ErrorKind::kInvalidArgument, "device KV transfer {} is already expected", destination.id);
  check_destination(destination, main_, residual_);
  incoming_.emplace(destination.id,
                    Incoming{expectation.peer, destination,
                             DeviceKvAssembly(expectation.num_layers, destination.num_blocks(), expectation.deadline),
                             expectation.deadline, false});
}

DeviceKvProgress SocketDeviceKvPlane::progress(DeviceKvTransferId id) const {
  std::lock_guard lock(mutex_);
  auto it = incoming_.find(id);
  if (it == incoming_.end()) return {};
  return it->second.assembly.progress(std::chrono::steady_clock::now());  // a deadline's verdict sticks
}

bool SocketDeviceKvPlane::finish(DeviceKvTransferId id) {
  std::lock_guard lock(mutex_);
  incoming_.erase(id);  // a connection still carrying it finds it gone and closes
  return true;          // this plane's own threads copy, under mutex_: nothing lands after this
}
bool SocketDeviceKvPlane::land_piece(DeviceKvTransferId id, std::span<const std::byte> body) {
  auto it = incoming_.find(id);
  if (it == incoming_.end()) return false;  // finished at this end: nothing lands any more
  Incoming& transfer = it->second;
  if (transfer.assembly.progress(std::chrono::steady_clock::now()).state != DeviceKvProgress::State::kPending)
    return false;
  kvlink::MessageReader reader(body.subspan(1));
  uint32_t layer = 0, first = 0, count = 0;
  const bool forked = !transfer.destination.residual_blocks.empty();
  const int64_t block_bytes = piece_block_bytes(main_.arrays_per_layer, main_.bytes_per_block,
                                                forked ? residual_.arrays_per_layer : 0, residual_.bytes_per_block);
  if (!reader.u32(layer) || !reader.u32(first) || !reader.u32(count) ||
      layer >= static_cast<uint32_t>(transfer.assembly.num_layers()) || count == 0 ||
      static_cast<int64_t>(first) + count > transfer.destination.num_blocks() ||
      static_cast<int64_t>(reader.remaining()) != static_cast<int64_t>(count) * block_bytes) {
    ++stats_.rejected_pieces;
    transfer.assembly.fail("a piece outside the reservation or of the wrong size");
    return false;
  }
  const std::byte* payload = body.data() + kLayerHeaderBytes;
  auto slice = [&](const std::vector<int32_t>& ids) { return std::span<const int32_t>(ids).subspan(first, count); };
  size_t used = scatter_layer(main_, static_cast<int32_t>(layer), slice(transfer.destination.main_blocks), payload);
  if (forked)
    used += scatter_layer(residual_, static_cast<int32_t>(layer), slice(transfer.destination.residual_blocks),
                          payload + used);
  ++stats_.pieces_received;
  stats_.bytes_received += static_cast<int64_t>(used);
  return transfer.assembly.land(static_cast<int32_t>(layer), static_cast<int32_t>(first), static_cast<int32_t>(count),
                                static_cast<int64_t>(used));
}

void SocketDeviceKvPlane::serve(int fd) {
  OpenRequest open;
  bool refused = false;
  std::optional<kvlink::Session> session =
      receive_open(fd, options_.secret, options_.io_timeout_seconds, "socket", sockets_.port(), open, refused);
  if (refused) {
    std::lock_guard lock(mutex_);
    ++stats_.refused_connections;
  }
  if (!session) return;
  const uint64_t id = open.id;
  const std::string& sender = open.sender;
  std::string refusal;
  uint32_t max_body = 0;
  std::chrono::steady_clock::time_point deadline;
  {
    std::lock_guard lock(mutex_);
    auto it = incoming_.find(id);
    if (it == incoming_.end()) {
      refusal = fmt::format("transfer {} is not expected here", id);
    } else {
      Incoming& transfer = it->second;
      const bool forked = !transfer.destination.residual_blocks.empty();
      refusal = open_refusal(open, transfer.peer, transfer.opened, transfer.assembly.num_layers(),
                             transfer.destination, main_, residual_);
      if (refusal.empty()) {
        transfer.opened = true;
        deadline = transfer.deadline;
        const int64_t block_bytes =
            piece_block_bytes(open.main_arrays, static_cast<int64_t>(open.main_bytes), forked ? open.residual_arrays : 0,
                              static_cast<int64_t>(open.residual_bytes));
        const int64_t largest = static_cast<int64_t>(kLayerHeaderBytes) + static_cast<int64_t>(open.blocks) * block_bytes;
        if (largest > int64_t{0xFFFFFFFF} - 64) refusal = "a layer of this transfer is too large for one message";
        max_body = static_cast<uint32_t>(std::min<int64_t>(largest, 0xFFFFFFFF));
      }
      // An open from another address leaves the transfer to the peer the reservation named.
      if (!refusal.empty() && transfer.peer == sender) transfer.assembly.fail("refused the sender: " + refusal);
    }
    if (!refusal.empty()) ++stats_.rejected_pieces;
  }
  if (!refusal.empty()) {
    spdlog::warn("device KV plane on port {}: refused transfer {} from {}: {}", sockets_.port(), id, sender, refusal);
    session->send(fd, verdict(false, refusal));
    return;
  }
  if (!session->send(fd, verdict(true, ""))) return;
  // The connection lives until the transfer's deadline at most (pieces come as the PE's prefill runs).
  const double until_deadline =
      std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
  kvlink::set_timeouts(fd, std::max(1.0, until_deadline + 1.0));
  auto fail_transfer = [&](const std::string& why) {
    std::lock_guard lock(mutex_);
    auto it = incoming_.find(id);
    if (it != incoming_.end()) it->second.assembly.fail(why);
  };
  std::vector<std::byte> body;
  while (!sockets_.stopping()) {
    const kvlink::Session::Received received = session->receive(fd, body, max_body);
    if (received == kvlink::Session::Received::kForged) {
      {
        std::lock_guard lock(mutex_);
        ++stats_.forged_messages;
      }
      spdlog::warn("device KV plane on port {}: a piece of transfer {} failed its authentication tag (changed, "
                   "replayed or reordered on the way): nothing of it lands, the transfer fails",
                   sockets_.port(), id);
      return fail_transfer("a piece failed its authentication tag");
    }
    if (received != kvlink::Session::Received::kOk) return fail_transfer("peer " + sender + " died (connection lost)");
    if (body.empty()) return fail_transfer("an empty message");
    const char code = static_cast<char>(body[0]);
    if (code == kOpLayer) {
      std::lock_guard lock(mutex_);
      if (!land_piece(id, body)) return;  // failed, finished here or past its deadline: the connection closes
    } else if (code == kOpEnd) {
      kvlink::MessageReader end(std::span<const std::byte>(body).subspan(1));
      uint8_t ok = 0;
      end.u8(ok);
      const std::string reason = text_of(end);
      std::lock_guard lock(mutex_);
      auto it = incoming_.find(id);
      if (it == incoming_.end()) return;
      if (ok != 1) {
        it->second.assembly.fail("the sender gave up: " + reason);
      } else if (!it->second.assembly.complete()) {
        it->second.assembly.fail("the sender ended with slices missing");
      }
      return;
    } else {
      {
        std::lock_guard lock(mutex_);
        ++stats_.rejected_pieces;
      }
      return fail_transfer("an unknown message");
    }
  }
}

}  // namespace loom
