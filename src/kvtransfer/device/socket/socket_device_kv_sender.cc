// The socket plane's sending half (PE): begin_send, send_layer, end_send and
// the thread per outgoing transfer (socket_device_kv_plane.h).
#include "kvtransfer/device/socket/socket_device_kv_plane.h"

#include <condition_variable>
#include <deque>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "kvtransfer/device/socket/socket_device_kv_wire.h"
#include "kvtransfer/kv_link_protocol.h"
#include "kvtransfer/kv_link_session.h"
#include "util/error.h"

namespace loom {

using namespace socket_plane_wire;  // NOLINT(google-build-using-namespace): this file speaks the wire format

struct SocketDeviceKvPlane::Outgoing {
  DeviceKvTransferId id = 0;
  std::string peer;
  DeviceKvDestination destination;
  int32_t num_layers = 0;
  // Guarded by the plane's mutex_:
  std::deque<std::vector<std::byte>> queue;  // 'L' bodies, in order
  bool ended = false;
  std::string end_failure;
  bool broken = false;  // the peer refused, died or the connection failed
  std::condition_variable changed;
};

void SocketDeviceKvPlane::wake_senders() {
  std::lock_guard lock(mutex_);
  for (auto& [id, outgoing] : outgoing_) outgoing->changed.notify_all();
}

bool SocketDeviceKvPlane::begin_send(const std::string& peer, const DeviceKvDestination& destination,
                                     int32_t num_layers) {
  if (!peer_allowed(options_.peers, peer, destination.id)) return false;
  auto outgoing = std::make_shared<Outgoing>();
  outgoing->id = destination.id;
  outgoing->peer = peer;
  outgoing->destination = destination;
  outgoing->num_layers = num_layers;
  {
    std::lock_guard lock(mutex_);
    if (sockets_.stopping() || outgoing_.count(destination.id) || !can_send(main_, residual_, num_layers, destination))
      return false;
    outgoing_[destination.id] = outgoing;
  }
  sockets_.start_thread([this, outgoing] { send_loop(outgoing); });
  return true;
}

bool SocketDeviceKvPlane::send_layer(DeviceKvTransferId id, const DeviceKvLayerPiece& piece) {
  std::lock_guard lock(mutex_);
  auto it = outgoing_.find(id);
  if (it == outgoing_.end() || it->second->broken) return false;
  Outgoing& outgoing = *it->second;
  const bool forked = !outgoing.destination.residual_blocks.empty();
  const size_t count = piece.main_sources.size();
  if (piece.layer < 0 || piece.layer >= outgoing.num_layers || !ids_in_pool(piece.main_sources, main_) ||
      (forked && (piece.residual_sources.size() != count || !ids_in_pool(piece.residual_sources, residual_))))
    return false;
  const int64_t bytes = static_cast<int64_t>(count) *
                        piece_block_bytes(main_.arrays_per_layer, main_.bytes_per_block,
                                          forked ? residual_.arrays_per_layer : 0, residual_.bytes_per_block);
  if (queued_bytes_ + bytes > options_.max_queued_bytes) {
    spdlog::warn("device KV transfer {}: {} bytes queued for sending already: the piece is refused", id, queued_bytes_);
    return false;
  }
  kvlink::MessageWriter writer;
  writer.op(kOpLayer).u32(static_cast<uint32_t>(piece.layer)).u32(static_cast<uint32_t>(piece.first_block))
      .u32(static_cast<uint32_t>(count));
  writer.bytes.reserve(writer.bytes.size() + static_cast<size_t>(bytes));
  append_layer(main_, piece.layer, piece.main_sources, writer.bytes);  // the CPU "fence": written already
  if (forked) append_layer(residual_, piece.layer, piece.residual_sources, writer.bytes);
  queued_bytes_ += bytes;
  outgoing.queue.push_back(std::move(writer.bytes));
  outgoing.changed.notify_all();
  return true;
}

void SocketDeviceKvPlane::end_send(DeviceKvTransferId id, const std::string& failure) {
  std::lock_guard lock(mutex_);
  auto it = outgoing_.find(id);
  if (it == outgoing_.end()) return;
  Outgoing& outgoing = *it->second;
  outgoing.ended = true;
  outgoing.end_failure = failure;
  if (!failure.empty()) {  // nothing more is worth sending
    for (const auto& body : outgoing.queue) queued_bytes_ -= static_cast<int64_t>(body.size() - kLayerHeaderBytes);
    outgoing.queue.clear();
  }
  outgoing.changed.notify_all();
  outgoing_.erase(it);  // the sending thread keeps it until the end went
}
void SocketDeviceKvPlane::send_loop(std::shared_ptr<Outgoing> outgoing) {
  Outgoing& out = *outgoing;
  auto broken = [&](const std::string& why) {
    std::lock_guard lock(mutex_);
    if (!out.broken)
      spdlog::warn("device KV transfer {} to {} failed: {} (the decode engine recomputes)", out.id, out.peer, why);
    out.broken = true;
    for (const auto& body : out.queue) queued_bytes_ -= static_cast<int64_t>(body.size() - kLayerHeaderBytes);
    out.queue.clear();
  };
  std::string failure;
  const int fd = sockets_.connect(out.peer, options_.io_timeout_seconds, failure);
  if (fd < 0) return broken("cannot connect: " + failure);
  auto close_fd = [&] { sockets_.close(fd); };
  std::optional<kvlink::Session> session = kvlink::client_handshake(fd, options_.secret, failure);
  if (!session) {
    broken("handshake failed: " + failure);
    return close_fd();
  }
  {
    std::lock_guard lock(mutex_);
    const std::vector<std::byte> open =
        write_open(out.destination, out.num_layers, main_, residual_, sockets_.address());
    failure.clear();
    if (!session->send(fd, open)) failure = "the connection failed";
  }
  std::vector<std::byte> answer;
  if (failure.empty() && session->receive(fd, answer, kMaxControlBytes) != kvlink::Session::Received::kOk)
    failure = "no answer to the open";
  if (failure.empty()) {
    kvlink::MessageReader reader(answer);
    uint8_t accepted = 0;
    if (!reader.u8(accepted) || accepted != 1) failure = "refused: " + text_of(reader);
  }
  if (!failure.empty()) {
    broken(failure);
    return close_fd();
  }
  while (true) {
    std::vector<std::byte> body;
    std::string end_failure;
    bool end = false;
    {
      std::unique_lock lock(mutex_);
      out.changed.wait(lock, [&] { return !out.queue.empty() || out.ended || out.broken || sockets_.stopping(); });
      if (sockets_.stopping() || out.broken) break;  // an engine going away just closes: the peer sees it die
      if (!out.queue.empty()) {
        body = std::move(out.queue.front());
        out.queue.pop_front();
        queued_bytes_ -= static_cast<int64_t>(body.size() - kLayerHeaderBytes);
      } else {
        end = true;
        end_failure = out.end_failure;
      }
    }
    if (end) {
      session->send(fd, control(kOpEnd, end_failure.empty() ? 1 : 0, end_failure));
      break;
    }
    if (!session->send(fd, body)) {
      broken("the connection failed mid-transfer");
      break;
    }
    std::lock_guard lock(mutex_);
    ++stats_.pieces_sent;
    stats_.bytes_sent += static_cast<int64_t>(body.size() - kLayerHeaderBytes);
  }
  close_fd();
}
}  // namespace loom
