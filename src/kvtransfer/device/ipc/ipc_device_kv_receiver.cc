// The cuda-ipc plane's receiving half (DE): expectations, progress, finish,
// quiescence and the thread per incoming connection (ipc_device_kv_plane.h).
#include <poll.h>

#include <algorithm>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "kvtransfer/device/ipc/ipc_device_kv_plane.h"
#include "kvtransfer/device/socket/socket_device_kv_wire.h"
#include "kvtransfer/kv_link_protocol.h"
#include "kvtransfer/kv_link_session.h"
#include "util/error.h"

namespace loom {

using namespace socket_plane_wire;  // NOLINT(google-build-using-namespace): this file speaks the wire format

namespace {
constexpr char kOpStop = 'X';
constexpr char kOpDrained = 'A';
}  // namespace

void IpcDeviceKvPlane::expect(const DeviceKvExpectation& expectation) {
  std::lock_guard lock(mutex_);
  const DeviceKvDestination& destination = expectation.destination;
  if (incoming_.count(destination.id))
    fail(ErrorKind::kInvalidArgument, "device KV transfer {} is already expected", destination.id);
  check_destination(destination, main_, residual_);
  Incoming incoming{expectation.peer, destination,
                    DeviceKvAssembly(expectation.num_layers, destination.num_blocks(), expectation.deadline),
                    expectation.deadline};
  incoming_.emplace(destination.id, std::move(incoming));
}

DeviceKvProgress IpcDeviceKvPlane::progress(DeviceKvTransferId id) const {
  std::lock_guard lock(mutex_);
  auto it = incoming_.find(id);
  if (it == incoming_.end() || it->second.stopping) return {};
  return it->second.assembly.progress(std::chrono::steady_clock::now());
}

bool IpcDeviceKvPlane::finish(DeviceKvTransferId id) {
  std::lock_guard lock(mutex_);
  auto it = incoming_.find(id);
  if (it == incoming_.end()) return true;
  Incoming& transfer = it->second;
  if (!transfer.writing || transfer.assembly.complete()) {  // nobody can write into the blocks any more
    incoming_.erase(it);
    return true;
  }
  transfer.stopping = true;  // the connection's thread stops the peer; quiesced() once it drained or went
  transfer.assembly.fail("finished at the decode engine");
  return false;
}

bool IpcDeviceKvPlane::quiesced(DeviceKvTransferId id) const {
  std::lock_guard lock(mutex_);
  return incoming_.count(id) == 0;
}

void IpcDeviceKvPlane::serve(int fd) {
  OpenRequest open;
  bool refused = false;
  std::optional<kvlink::Session> session =
      receive_open(fd, options_.secret, options_.io_timeout_seconds, "cuda-ipc", sockets_.port(), open, refused);
  if (refused) {
    std::lock_guard lock(mutex_);
    ++stats_.refused_connections;
  }
  if (!session) return;
  const uint64_t id = open.id;
  const std::string& sender = open.sender;
  std::string refusal;
  kvlink::MessageWriter answer;
  {
    std::lock_guard lock(mutex_);
    auto it = incoming_.find(id);
    if (it == incoming_.end() || it->second.stopping) {
      refusal = fmt::format("transfer {} is not expected here", id);
    } else {
      Incoming& transfer = it->second;
      const bool forked = !transfer.destination.residual_blocks.empty();
      refusal = open_refusal(open, transfer.peer, transfer.opened, transfer.assembly.num_layers(),
                             transfer.destination, main_, residual_);
      if (refusal.empty()) {
        transfer.opened = true;
        transfer.writing = true;  // from the answer on, the peer may write
        answer.bytes.push_back(std::byte{1});
        auto pool = [&](const Exported& exported) {
          answer.u32(static_cast<uint32_t>(exported.handles.size()));
          for (const std::vector<std::byte>& handle : exported.handles)
            answer.u32(static_cast<uint32_t>(handle.size())).raw(handle);
          answer.u32(static_cast<uint32_t>(exported.offsets.size()));
          for (uint64_t offset : exported.offsets) answer.u64(offset);
        };
        pool(main_export_);
        pool(forked ? residual_export_ : Exported{});
      }
      // An open from another address leaves the transfer to the peer the reservation named.
      if (!refusal.empty() && transfer.peer == sender) transfer.assembly.fail("refused the sender: " + refusal);
    }
    if (!refusal.empty()) ++stats_.rejected_opens;
  }
  if (!refusal.empty()) {
    spdlog::warn("device KV plane cuda-ipc on port {}: refused transfer {} from {}: {}", sockets_.port(), id, sender,
                 refusal);
    session->send(fd, verdict(false, refusal));
    return;
  }
  session->send(fd, answer.bytes);  // a failed send shows as the connection's end below
  serve_transfer(fd, *session, id, sender);
}

void IpcDeviceKvPlane::serve_transfer(int fd, kvlink::Session& session, DeviceKvTransferId id,
                                      const std::string& sender) {
  using Clock = std::chrono::steady_clock;
  std::optional<Clock::time_point> stop_sent;  // when 'X' went
  // The peer ended: its copies ran (before 'E' or 'A') or died with it. Drops a finished transfer (quiesced).
  auto peer_done = [&](const std::string& failure) {
    std::lock_guard lock(mutex_);
    auto it = incoming_.find(id);
    if (it == incoming_.end()) return;
    it->second.writing = false;
    if (it->second.stopping) {
      incoming_.erase(it);
    } else if (!failure.empty()) {
      it->second.assembly.fail(failure);
    }
  };
  while (true) {
    bool stop = false;
    {
      std::lock_guard lock(mutex_);
      auto it = incoming_.find(id);
      if (it == incoming_.end()) return;  // done and finished
      stop = it->second.stopping;
      if (!stop && !it->second.assembly.complete() &&
          it->second.assembly.progress(Clock::now()).state == DeviceKvProgress::State::kFailed)
        stop = true;  // past its deadline: stop the peer before the engine finishes it
    }
    if (sockets_.stopping()) return;  // this engine goes: its pools go with it
    if (stop && !stop_sent) {
      session.send(fd, control(kOpStop, 0, "the decode engine gave up on the transfer"));
      stop_sent = Clock::now();
      std::lock_guard lock(mutex_);
      ++stats_.stopped_transfers;
    }
    if (stop_sent && Clock::now() - *stop_sent > std::chrono::duration<double>(options_.io_timeout_seconds)) {
      spdlog::error("device KV transfer {}: {} neither acknowledged the stop nor closed within {} s: its blocks stay "
                    "out of the pool for good",
                    id, sender, options_.io_timeout_seconds);
      return;  // `writing` stays set: never quiesced
    }
    pollfd watch{fd, POLLIN, 0};
    const int ready = ::poll(&watch, 1, 20);
    if (ready == 0) continue;
    std::vector<std::byte> body;
    const kvlink::Session::Received received = session.receive(fd, body, kMaxControlBytes);
    if (received != kvlink::Session::Received::kOk || body.empty())
      return peer_done(received == kvlink::Session::Received::kForged ? "a message failed its authentication tag"
                                                                      : "peer " + sender + " died (connection lost)");
    kvlink::MessageReader reader(std::span<const std::byte>(body).subspan(1));
    const char code = static_cast<char>(body[0]);
    if (code == kOpLayer) {
      uint32_t layer = 0, first = 0, count = 0;
      std::lock_guard lock(mutex_);
      auto it = incoming_.find(id);
      if (it == incoming_.end()) return;
      Incoming& transfer = it->second;
      if (transfer.stopping) continue;
      if (!reader.u32(layer) || !reader.u32(first) || !reader.u32(count) || reader.remaining() != 0 ||
          layer >= static_cast<uint32_t>(transfer.assembly.num_layers()) || count == 0 ||
          static_cast<int64_t>(first) + count > transfer.destination.num_blocks()) {
        transfer.assembly.fail("a piece outside the reservation");
        continue;  // the peer is still writing: the engine's finish() stops it
      }
      const bool forked = !transfer.destination.residual_blocks.empty();
      const int64_t bytes = static_cast<int64_t>(count) *
                            (main_.arrays_per_layer * main_.bytes_per_block +
                             (forked ? residual_.arrays_per_layer * residual_.bytes_per_block : 0));
      ++stats_.pieces_received;
      stats_.bytes_received += bytes;
      transfer.assembly.land(static_cast<int32_t>(layer), static_cast<int32_t>(first), static_cast<int32_t>(count),
                             bytes);
    } else if (code == kOpEnd || code == kOpDrained) {
      uint8_t ok = 0;
      reader.u8(ok);
      const std::string reason = text_of(reader);
      std::string failure;
      if (code == kOpEnd && ok != 1) failure = "the sender gave up: " + reason;
      {
        std::lock_guard lock(mutex_);
        auto it = incoming_.find(id);
        if (it != incoming_.end() && failure.empty() && code == kOpEnd && !it->second.assembly.complete())
          failure = "the sender ended with slices missing";
      }
      return peer_done(failure);
    } else {
      return peer_done("an unknown message");  // the connection closes: the peer stops writing
    }
  }
}

}  // namespace loom
