#include "kvtransfer/device/socket/socket_device_kv_plane.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <numeric>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "kvtransfer/device/device_kv_runs.h"
#include "kvtransfer/kv_link_protocol.h"
#include "kvtransfer/kv_link_session.h"
#include "util/error.h"

namespace loom {
namespace {

constexpr char kOpOpen = 'O';
constexpr char kOpLayer = 'L';
constexpr char kOpEnd = 'E';
constexpr uint32_t kMaxControlBytes = 4096;
constexpr size_t kMaxAddressBytes = 256;
constexpr size_t kLayerHeaderBytes = 1 + 4 + 4 + 4;
constexpr double kHandshakeTimeoutSeconds = 5.0;

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

}  // namespace

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

SocketDeviceKvPlane::SocketDeviceKvPlane(SocketDeviceKvPlaneOptions options) : options_(std::move(options)) {
  std::string failure;
  listen_fd_ = kvlink::open_socket(
      options_.host, options_.port, /*passive=*/true,
      [](int fd, const sockaddr* address, socklen_t length) {
        const int yes = 1;
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
        return ::bind(fd, address, length) == 0 && ::listen(fd, 64) == 0;
      },
      failure);
  if (listen_fd_ < 0)
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("device KV plane socket: cannot listen on {}:{}: {}", options_.host, options_.port, failure),
                "choose another --kv-device-plane-port (0 picks a free one)");
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &length);
  port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (options_.secret.empty() && !kvlink::is_loopback(reinterpret_cast<const sockaddr*>(&bound))) {
    ::close(listen_fd_);
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("device KV plane socket: refusing to listen on {} without a shared secret: any host that "
                            "reaches it could write KV blocks other requests then read",
                            options_.host),
                "give every engine and the router the same --kv-transfer-secret-file, or keep the link on loopback");
  }
  const std::string& host = options_.host;
  announced_host_ = host == "0.0.0.0" || host == "::" || host.empty() ? "127.0.0.1" : host;
  char name[256] = {};
  machine_ = ::gethostname(name, sizeof(name) - 1) == 0 ? name : "localhost";
  accept_thread_ = std::thread([this] { accept_loop(); });
}

SocketDeviceKvPlane::~SocketDeviceKvPlane() {
  stopping_ = true;
  {
    std::lock_guard lock(mutex_);
    for (auto& [id, outgoing] : outgoing_) outgoing->changed.notify_all();
  }
  ::shutdown(listen_fd_, SHUT_RDWR);
  accept_thread_.join();
  ::close(listen_fd_);
  std::vector<Worker> threads;
  {
    std::lock_guard lock(threads_mutex_);
    for (int fd : sockets_) ::shutdown(fd, SHUT_RDWR);
    threads.swap(threads_);
  }
  // Sending threads wait on their transfer's condition: wake them until they see stopping_.
  for (Worker& worker : threads) {
    while (!*worker.done) {
      {
        std::lock_guard lock(mutex_);
        for (auto& [id, outgoing] : outgoing_) outgoing->changed.notify_all();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    worker.thread.join();
  }
}

DeviceKvEndpoint SocketDeviceKvPlane::endpoint() const {
  return {kName, machine_, "cpu", fmt::format("{}:{}", announced_host_, port_), /*same_host_only=*/false};
}

SocketDeviceKvPlaneStats SocketDeviceKvPlane::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void SocketDeviceKvPlane::bind_pools(const KvPoolMemory& main, const KvPoolMemory& residual) {
  if (main.kind != KvPoolMemory::Kind::kHost || (!residual.empty() && residual.kind != KvPoolMemory::Kind::kHost))
    fail(ErrorKind::kUnsupported,
         "the socket device KV plane moves host memory only (CPU engines); GPU engines need a GPU plane");
  std::lock_guard lock(mutex_);
  main_ = main;
  residual_ = residual;
}

void SocketDeviceKvPlane::expect(const DeviceKvExpectation& expectation) {
  std::lock_guard lock(mutex_);
  const DeviceKvDestination& destination = expectation.destination;
  if (incoming_.count(destination.id))
    fail(ErrorKind::kInvalidArgument, "device KV transfer {} is already expected", destination.id);
  const bool forked = !destination.residual_blocks.empty();
  if (!ids_in_pool(destination.main_blocks, main_) ||
      (forked && (destination.residual_blocks.size() != destination.main_blocks.size() ||
                  !ids_in_pool(destination.residual_blocks, residual_))))
    fail(ErrorKind::kInvalidArgument, "device KV transfer {}: block ids outside the bound pools", destination.id);
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

void SocketDeviceKvPlane::finish(DeviceKvTransferId id) {
  std::lock_guard lock(mutex_);
  incoming_.erase(id);  // a connection still carrying it finds it gone and closes
}

bool SocketDeviceKvPlane::begin_send(const std::string& peer, const DeviceKvDestination& destination,
                                     int32_t num_layers) {
  if (!options_.peers.allows(peer)) {
    spdlog::warn("device KV transfer {}: {} is not an allowed peer ({}): not sent", destination.id, peer,
                 options_.peers.describe());
    return false;
  }
  auto outgoing = std::make_shared<Outgoing>();
  outgoing->id = destination.id;
  outgoing->peer = peer;
  outgoing->destination = destination;
  outgoing->num_layers = num_layers;
  {
    std::lock_guard lock(mutex_);
    if (stopping_ || main_.empty() || main_.num_layers() != num_layers || outgoing_.count(destination.id) ||
        (!destination.residual_blocks.empty() && residual_.empty()))
      return false;
    outgoing_[destination.id] = outgoing;
  }
  start_thread([this, outgoing] { send_loop(outgoing); });
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

void SocketDeviceKvPlane::start_thread(std::function<void()> run) {
  std::lock_guard lock(threads_mutex_);
  reap_finished();
  auto done = std::make_shared<std::atomic<bool>>(false);
  threads_.push_back({std::thread([run = std::move(run), done] {
                        run();
                        *done = true;
                      }),
                      done});
}

void SocketDeviceKvPlane::reap_finished() {
  for (auto it = threads_.begin(); it != threads_.end();) {
    if (*it->done) {
      it->thread.join();
      it = threads_.erase(it);
    } else {
      ++it;
    }
  }
}

// ---- sending (PE) ----

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
  int fd = -1;
  try {
    const auto [host, port] = kvlink::split_address(out.peer);
    fd = kvlink::open_socket(
        host, port, /*passive=*/false,
        [&](int candidate, const sockaddr* address, socklen_t length) {
          {
            std::lock_guard lock(threads_mutex_);
            if (stopping_) return false;
            sockets_.insert(candidate);
          }
          kvlink::set_timeouts(candidate, options_.io_timeout_seconds);
          if (::connect(candidate, address, length) == 0) return true;
          const int error = errno;
          std::lock_guard lock(threads_mutex_);
          sockets_.erase(candidate);
          errno = error;
          return false;
        },
        failure);
  } catch (const Error& error) {
    failure = error.what();
  }
  if (fd < 0) return broken("cannot connect: " + failure);
  const int yes = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
  auto close_fd = [&] {
    std::lock_guard lock(threads_mutex_);
    sockets_.erase(fd);
    ::close(fd);
  };
  std::optional<kvlink::Session> session = kvlink::client_handshake(fd, options_.secret, failure);
  if (!session) {
    broken("handshake failed: " + failure);
    return close_fd();
  }
  {
    std::lock_guard lock(mutex_);
    const bool forked = !out.destination.residual_blocks.empty();
    kvlink::MessageWriter open;
    open.op(kOpOpen).u64(out.id).u32(static_cast<uint32_t>(out.num_layers))
        .u32(static_cast<uint32_t>(out.destination.num_blocks())).u32(static_cast<uint32_t>(main_.arrays_per_layer))
        .u64(static_cast<uint64_t>(main_.bytes_per_block)).u32(forked ? residual_.arrays_per_layer : 0)
        .u64(forked ? static_cast<uint64_t>(residual_.bytes_per_block) : 0)
        .raw(kvlink::as_bytes(fmt::format("{}:{}", announced_host_, port_)));
    failure.clear();
    if (!session->send(fd, open.bytes)) failure = "the connection failed";
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
      out.changed.wait(lock, [&] { return !out.queue.empty() || out.ended || out.broken || stopping_.load(); });
      if (stopping_ || out.broken) break;  // an engine going away just closes: the peer sees it die
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

// ---- receiving (DE) ----

void SocketDeviceKvPlane::accept_loop() {
  while (!stopping_) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (stopping_) return;
      if (errno == EMFILE || errno == ENFILE) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      return;
    }
    {
      std::lock_guard lock(threads_mutex_);
      if (stopping_ || sockets_.size() >= 256) {
        ::close(fd);
        continue;
      }
      sockets_.insert(fd);
    }
    start_thread([this, fd] {
      serve(fd);
      std::lock_guard lock(threads_mutex_);
      sockets_.erase(fd);
      ::close(fd);
    });
  }
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
  const int yes = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
  kvlink::set_timeouts(fd, std::min(kHandshakeTimeoutSeconds, options_.io_timeout_seconds));
  kvlink::HandshakeFailure handshake = kvlink::HandshakeFailure::kNone;
  std::optional<kvlink::Session> session = kvlink::server_handshake(fd, options_.secret, handshake);
  if (!session) {
    {
      std::lock_guard lock(mutex_);
      ++stats_.refused_connections;
    }
    spdlog::warn("device KV plane on port {}: refused a connection: {}", port_,
                 kvlink::handshake_failure_text(handshake));
    return;
  }
  kvlink::set_timeouts(fd, options_.io_timeout_seconds);
  std::vector<std::byte> body;
  if (session->receive(fd, body, kMaxControlBytes) != kvlink::Session::Received::kOk) return;
  kvlink::MessageReader open(body);
  uint8_t op = 0;
  uint64_t id = 0, main_bytes = 0, residual_bytes = 0;
  uint32_t layers = 0, blocks = 0, main_arrays = 0, residual_arrays = 0;
  if (!open.u8(op) || op != static_cast<uint8_t>(kOpOpen) || !open.u64(id) || !open.u32(layers) || !open.u32(blocks) ||
      !open.u32(main_arrays) || !open.u64(main_bytes) || !open.u32(residual_arrays) || !open.u64(residual_bytes) ||
      open.remaining() > kMaxAddressBytes)
    return;
  const std::string sender = text_of(open);
  std::string refusal;
  uint32_t max_body = 0;
  std::chrono::steady_clock::time_point deadline;
  {
    std::lock_guard lock(mutex_);
    auto it = incoming_.find(id);
    if (it == incoming_.end()) {
      refusal = fmt::format("transfer {} is not expected here", id);
    } else if (it->second.peer != sender) {
      refusal = fmt::format("transfer {} is expected from {}, not {}", id, it->second.peer, sender);
    } else {
      Incoming& transfer = it->second;
      const bool forked = !transfer.destination.residual_blocks.empty();
      if (transfer.opened) {
        refusal = "the transfer is open on another connection";
      } else if (static_cast<int32_t>(layers) != transfer.assembly.num_layers() ||
                 static_cast<int32_t>(blocks) != transfer.destination.num_blocks()) {
        refusal = fmt::format("the sender has {} layers x {} blocks, the reservation {} x {}", layers, blocks,
                              transfer.assembly.num_layers(), transfer.destination.num_blocks());
      } else if (static_cast<int32_t>(main_arrays) != main_.arrays_per_layer ||
                 static_cast<int64_t>(main_bytes) != main_.bytes_per_block ||
                 (forked && (static_cast<int32_t>(residual_arrays) != residual_.arrays_per_layer ||
                             static_cast<int64_t>(residual_bytes) != residual_.bytes_per_block)) ||
                 (!forked && residual_arrays != 0)) {
        refusal = "the engines lay a block out differently (model, dtype, block size or rank differ)";
      } else {
        transfer.opened = true;
        deadline = transfer.deadline;
        const int64_t block_bytes = piece_block_bytes(main_arrays, static_cast<int64_t>(main_bytes),
                                                      forked ? residual_arrays : 0, static_cast<int64_t>(residual_bytes));
        const int64_t largest = static_cast<int64_t>(kLayerHeaderBytes) + static_cast<int64_t>(blocks) * block_bytes;
        if (largest > int64_t{0xFFFFFFFF} - 64) refusal = "a layer of this transfer is too large for one message";
        max_body = static_cast<uint32_t>(std::min<int64_t>(largest, 0xFFFFFFFF));
      }
      if (!refusal.empty()) transfer.assembly.fail("refused the sender: " + refusal);
    }
    if (!refusal.empty()) ++stats_.rejected_pieces;
  }
  if (!refusal.empty()) {
    spdlog::warn("device KV plane on port {}: refused transfer {} from {}: {}", port_, id, sender, refusal);
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
  while (!stopping_) {
    const kvlink::Session::Received received = session->receive(fd, body, max_body);
    if (received == kvlink::Session::Received::kForged) {
      {
        std::lock_guard lock(mutex_);
        ++stats_.forged_messages;
      }
      spdlog::warn("device KV plane on port {}: a piece of transfer {} failed its authentication tag (changed, "
                   "replayed or reordered on the way): nothing of it lands, the transfer fails",
                   port_, id);
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
