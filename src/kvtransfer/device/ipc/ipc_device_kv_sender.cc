// The cuda-ipc plane's sending half (PE): begin_send, send_layer, end_send
// and the thread per outgoing transfer (ipc_device_kv_plane.h).
#include <poll.h>

#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "kvtransfer/device/device_kv_runs.h"
#include "kvtransfer/device/ipc/ipc_device_kv_plane.h"
#include "kvtransfer/device/socket/socket_device_kv_wire.h"
#include "kvtransfer/kv_link_protocol.h"
#include "kvtransfer/kv_link_session.h"

namespace loom {

using namespace socket_plane_wire;  // NOLINT(google-build-using-namespace): this file speaks the wire format

namespace {
constexpr char kOpStop = 'X';
constexpr char kOpDrained = 'A';
constexpr uint32_t kMaxAnswerBytes = 1 << 20;
}  // namespace

struct IpcDeviceKvPlane::Piece {
  int32_t layer = 0, first = 0;
  std::vector<int32_t> main_sources, residual_sources;
};

struct IpcDeviceKvPlane::Outgoing {
  struct Pending {
    int32_t layer = 0, first = 0, count = 0;
    int64_t bytes = 0;
    PeerKvCopier::Ticket ticket = 0;
  };
  DeviceKvTransferId id = 0;
  std::string peer;
  DeviceKvDestination destination;
  int32_t num_layers = 0;
  // Guarded by the plane's mutex_:
  bool mapped = false;                             // the peer's pools are mapped: copies go straight
  std::vector<std::byte*> remote_main, remote_residual;  // the peer's arrays, mapped here
  std::deque<Piece> unmapped;                      // pieces sent before the mapping
  std::deque<Pending> pending;                     // copies enqueued, 'L' not yet sent
  bool ended = false;
  std::string end_failure;
  bool broken = false;  // the peer refused, stopped or died, or the connection failed: nothing more is copied
  std::condition_variable changed;
};

void IpcDeviceKvPlane::wake_senders() {
  std::lock_guard lock(mutex_);
  for (auto& [id, outgoing] : outgoing_) outgoing->changed.notify_all();
}

bool IpcDeviceKvPlane::begin_send(const std::string& peer, const DeviceKvDestination& destination,
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

void IpcDeviceKvPlane::enqueue_copies(Outgoing& out, const DeviceKvLayerPiece& piece) {
  const int32_t count = static_cast<int32_t>(piece.main_sources.size());
  auto destinations = [&](const std::vector<int32_t>& ids) {
    return std::span<const int32_t>(ids).subspan(static_cast<size_t>(piece.first_block), static_cast<size_t>(count));
  };
  int64_t bytes = 0;
  auto copy_pool = [&](const KvPoolMemory& pool, const std::vector<std::byte*>& remote,
                       std::span<const int32_t> sources, const std::vector<int32_t>& destination_ids) {
    const std::vector<DeviceKvBlockRun> runs = coalesce_block_runs(sources, destinations(destination_ids));
    for (int32_t a = 0; a < pool.arrays_per_layer; ++a) {
      const size_t array = static_cast<size_t>(piece.layer) * pool.arrays_per_layer + a;
      for (const DeviceKvBlockRun& run : runs) {
        copier_->copy(pool.rank_of_array(array), remote[array] + run.destination * pool.bytes_per_block,
                      pool.arrays[array] + run.source * pool.bytes_per_block, run.count * pool.bytes_per_block);
        bytes += run.count * pool.bytes_per_block;
      }
    }
  };
  copy_pool(main_, out.remote_main, piece.main_sources, out.destination.main_blocks);
  if (!piece.residual_sources.empty())
    copy_pool(residual_, out.remote_residual, piece.residual_sources, out.destination.residual_blocks);
  out.pending.push_back({piece.layer, piece.first_block, count, bytes, copier_->record()});
  out.changed.notify_all();
}

bool IpcDeviceKvPlane::send_layer(DeviceKvTransferId id, const DeviceKvLayerPiece& piece) {
  std::lock_guard lock(mutex_);
  auto it = outgoing_.find(id);
  if (it == outgoing_.end() || it->second->broken) return false;
  Outgoing& out = *it->second;
  const bool forked = !out.destination.residual_blocks.empty();
  const size_t count = piece.main_sources.size();
  if (piece.layer < 0 || piece.layer >= out.num_layers || count == 0 || piece.first_block < 0 ||
      static_cast<int64_t>(piece.first_block) + static_cast<int64_t>(count) > out.destination.num_blocks() ||
      !ids_in_pool(piece.main_sources, main_) ||
      (forked && (piece.residual_sources.size() != count || !ids_in_pool(piece.residual_sources, residual_))))
    return false;
  try {
    copier_->after(piece.fence);  // every later copy on the copy stream waits for this layer's writes
    if (out.mapped) {
      enqueue_copies(out, piece);
    } else {  // kept (the ids only: the fence is waited for already) until the mapping comes
      Piece kept{piece.layer, piece.first_block, {piece.main_sources.begin(), piece.main_sources.end()}, {}};
      if (forked) kept.residual_sources.assign(piece.residual_sources.begin(), piece.residual_sources.end());
      out.unmapped.push_back(std::move(kept));
    }
  } catch (const std::exception& error) {
    spdlog::warn("device KV transfer {}: the copy failed to start: {}", id, error.what());
    out.broken = true;
    return false;
  }
  return true;
}

void IpcDeviceKvPlane::end_send(DeviceKvTransferId id, const std::string& failure) {
  std::shared_ptr<Outgoing> outgoing;
  std::optional<PeerKvCopier::Ticket> last;
  {
    std::unique_lock lock(mutex_);
    auto it = outgoing_.find(id);
    if (it == outgoing_.end()) return;
    outgoing = it->second;
    Outgoing& out = *outgoing;
    out.ended = true;
    out.end_failure = failure;
    if (failure.empty() && !out.unmapped.empty())  // pieces wait for the mapping: give it a moment
      out.changed.wait_for(lock, std::chrono::duration<double>(options_.open_wait_seconds),
                           [&] { return out.mapped || out.broken || sockets_.stopping(); });
    if (!out.unmapped.empty()) {
      out.unmapped.clear();
      if (out.end_failure.empty()) out.end_failure = "the decode engine's pools were not mapped in time";
    }
    if (!out.pending.empty()) last = out.pending.back().ticket;
    out.changed.notify_all();
    outgoing_.erase(it);  // the sending thread keeps it until the end went
  }
  // From here on no copy reads this transfer's source blocks: the engine may reuse them.
  if (last) copier_->wait(*last);
}

void IpcDeviceKvPlane::drain(Outgoing& out) {
  std::deque<Outgoing::Pending> pending;
  {
    std::lock_guard lock(mutex_);
    out.broken = true;
    out.unmapped.clear();
    pending.swap(out.pending);
  }
  for (const Outgoing::Pending& copy : pending) {
    copier_->wait(copy.ticket);
    copier_->release(copy.ticket);
  }
}

void IpcDeviceKvPlane::send_loop(std::shared_ptr<Outgoing> outgoing) {
  Outgoing& out = *outgoing;
  auto broken = [&](const std::string& why) {
    {
      std::lock_guard lock(mutex_);
      if (!out.broken)
        spdlog::warn("device KV transfer {} to {} failed: {} (the decode engine recomputes)", out.id, out.peer, why);
    }
    drain(out);
  };
  std::string failure;
  const int fd = sockets_.connect(out.peer, options_.io_timeout_seconds, failure);
  if (fd < 0) return broken("cannot connect: " + failure);
  std::optional<kvlink::Session> session = kvlink::client_handshake(fd, options_.secret, failure);
  if (!session) {
    broken("handshake failed: " + failure);
    return sockets_.close(fd);
  }
  failure.clear();  // connect's notes on addresses it tried before the one that answered
  {
    std::lock_guard lock(mutex_);
    const std::vector<std::byte> open =
        write_open(out.destination, out.num_layers, main_, residual_, sockets_.address());
    if (!session->send(fd, open)) failure = "the connection failed";
  }
  std::vector<std::byte> answer;
  if (failure.empty() && session->receive(fd, answer, kMaxAnswerBytes) != kvlink::Session::Received::kOk)
    failure = "no answer to the open";
  kvlink::MessageReader reader(answer);
  if (failure.empty()) {
    uint8_t accepted = 0;
    if (!reader.u8(accepted) || accepted != 1) failure = "refused: " + text_of(reader);
  }
  // The answer's pools: handle, offsets; mapped here (the copier keeps a mapping for later transfers).
  auto map_pool = [&](const KvPoolMemory& local, std::vector<std::byte*>& remote, bool used) {
    uint32_t ranks = 0, arrays = 0;
    if (!reader.u32(ranks) || ranks > static_cast<uint32_t>(KvLayerFence::kMaxRanks))
      return std::string("a malformed answer");
    if (used && ranks != static_cast<uint32_t>(local.num_ranks))
      return fmt::format("the decode engine has {} tensor-parallel ranks, this one {}", ranks, local.num_ranks);
    std::vector<std::vector<std::byte>> handles(ranks);
    for (auto& handle : handles) {
      uint32_t handle_bytes = 0;
      if (!reader.u32(handle_bytes) || handle_bytes > 4096) return std::string("a malformed answer");
      handle.resize(handle_bytes);
      if (!reader.raw(handle)) return std::string("a malformed answer");
    }
    if (!reader.u32(arrays)) return std::string("a malformed answer");
    if (arrays != (used ? local.arrays.size() : 0))
      return fmt::format("the decode engine's pool has {} arrays, this one {}", arrays, local.arrays.size());
    std::vector<uint64_t> offsets(arrays);
    for (uint64_t& offset : offsets)
      if (!reader.u64(offset)) return std::string("a malformed answer");
    if (arrays == 0) return std::string();
    std::vector<std::byte*> bases;
    for (uint32_t rank = 0; rank < ranks; ++rank)
      bases.push_back(copier_->import(static_cast<int32_t>(rank), handles[rank]));
    for (size_t a = 0; a < offsets.size(); ++a)
      remote.push_back(bases[static_cast<size_t>(local.rank_of_array(a))] + offsets[a]);
    return std::string();
  };
  std::vector<std::byte*> remote_main, remote_residual;
  if (failure.empty()) {
    try {
      failure = map_pool(main_, remote_main, true);
      if (failure.empty()) failure = map_pool(residual_, remote_residual, !out.destination.residual_blocks.empty());
    } catch (const std::exception& error) {
      failure = error.what();
    }
    if (!failure.empty()) session->send(fd, control(kOpEnd, 0, failure));  // the DE fails it at once
  }
  if (!failure.empty()) {
    broken(failure);
    return sockets_.close(fd);
  }
  {
    std::lock_guard lock(mutex_);
    out.remote_main = std::move(remote_main);
    out.remote_residual = std::move(remote_residual);
    out.mapped = true;
    try {
      for (const Piece& piece : out.unmapped)
        enqueue_copies(out, {piece.layer, piece.first, piece.main_sources, piece.residual_sources, {}});
    } catch (const std::exception& error) {
      failure = error.what();
    }
    out.unmapped.clear();
    out.changed.notify_all();
  }
  if (!failure.empty()) {
    session->send(fd, control(kOpEnd, 0, "the copy failed to start: " + failure));
    broken(failure);
    return sockets_.close(fd);
  }
  while (true) {
    std::optional<Outgoing::Pending> next;
    bool end = false;
    std::string end_failure;
    {
      std::unique_lock lock(mutex_);
      out.changed.wait_for(lock, std::chrono::milliseconds(10), [&] {
        return !out.pending.empty() || out.ended || out.broken || sockets_.stopping();
      });
      if (sockets_.stopping() || out.broken) break;
      if (!out.pending.empty()) {
        next = out.pending.front();
      } else if (out.ended) {
        end = true;
        end_failure = out.end_failure;
      }
    }
    if (next) {
      copier_->wait(next->ticket);
      kvlink::MessageWriter landed;
      landed.op(kOpLayer).u32(static_cast<uint32_t>(next->layer)).u32(static_cast<uint32_t>(next->first))
          .u32(static_cast<uint32_t>(next->count));
      {
        std::lock_guard lock(mutex_);
        out.pending.pop_front();
        ++stats_.pieces_sent;
        stats_.bytes_sent += next->bytes;
      }
      copier_->release(next->ticket);
      if (!session->send(fd, landed.bytes)) {
        broken("the connection failed mid-transfer");
        break;
      }
      continue;
    }
    if (end) {
      session->send(fd, control(kOpEnd, end_failure.empty() ? 1 : 0, end_failure));
      break;
    }
    // Nothing to report: has the DE asked to stop (or gone)?
    pollfd watch{fd, POLLIN, 0};
    if (::poll(&watch, 1, 0) <= 0) continue;
    std::vector<std::byte> body;
    const kvlink::Session::Received received = session->receive(fd, body, kMaxControlBytes);
    drain(out);  // 'X', a close or anything else: copy nothing more, wait for what was enqueued
    if (received == kvlink::Session::Received::kOk && !body.empty() && static_cast<char>(body[0]) == kOpStop) {
      kvlink::MessageReader stop(std::span<const std::byte>(body).subspan(1));
      uint8_t flag = 0;
      stop.u8(flag);
      spdlog::info("device KV transfer {}: the decode engine stopped it ({}); copies drained", out.id,
                   text_of(stop));
      session->send(fd, control(kOpDrained, 1, ""));
    }
    break;
  }
  drain(out);
  sockets_.close(fd);
}

}  // namespace loom
