#include "kvtransfer/kv_link_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "kvtransfer/kv_link_protocol.h"
#include "util/error.h"

namespace loom {

KvLinkServer::KvLinkServer(BufferedKvStore& store, const std::string& host, int port, KvLinkServerOptions options)
    : store_(store), options_(std::move(options)), host_(host) {
  const kvlink::Listener listener = kvlink::listen_for_kv(host, port, !options_.secret.empty(), "KV link",
                                                           "choose another --kv-transfer-port (0 picks a free one)");
  listen_fd_ = listener.fd;
  port_ = listener.port;
  accept_thread_ = std::thread([this] { accept_loop(); });
}

KvLinkServer::~KvLinkServer() {
  stopping_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  accept_thread_.join();
  ::close(listen_fd_);
  std::vector<kvlink::WorkerThreads::Worker> threads;
  {
    std::lock_guard lock(mutex_);
    for (int fd : connections_) ::shutdown(fd, SHUT_RDWR);
    threads = threads_.take_all();
  }
  for (auto& worker : threads) worker.thread.join();
}

KvLinkServerStats KvLinkServer::stats() const {
  KvLinkServerStats stats;
  stats.num_received_blocks = received_blocks_.load();
  stats.num_received_bytes = received_bytes_.load();
  stats.num_connections = connections_total_.load();
  stats.num_rejected_blocks = rejected_blocks_.load();
  stats.num_refused_connections = refused_connections_.load();
  stats.num_forged_messages = forged_messages_.load();
  stats.num_channel_bytes = channel_bytes_.load();
  stats.num_channels = channels_total_.load();
  return stats;
}

void KvLinkServer::accept_loop() {
  while (!stopping_) {
    const int fd = kvlink::accept_connection(listen_fd_, stopping_);
    if (fd < 0) return;
    std::lock_guard lock(mutex_);
    if (stopping_ || static_cast<int>(connections_.size()) >= kMaxConnections) {
      ::close(fd);
      continue;
    }
    connections_.insert(fd);
    ++connections_total_;
    threads_.start([this, fd] { serve(fd); });
  }
}

bool KvLinkServer::receive_put(int fd, kvlink::Session& session, kvlink::MessageReader& request,
                               KvBulkChannel* channel) {
  struct Header {
    KvBlockHash hash;
    uint64_t size = 0;
    kvlink::Digest digest{};
  };
  uint32_t count = 0;
  if (!request.u32(count) || count > kvlink::kMaxBlocksPerRequest ||
      request.remaining() != static_cast<size_t>(count) * kvlink::kBlockHeaderBytes)
    return false;
  std::vector<Header> headers(count);
  uint64_t total = 0;
  for (Header& header : headers) {
    if (!request.hash(header.hash) || !request.u64(header.size) || !request.raw(header.digest) ||
        header.size > kvlink::kMaxPayloadBytes)
      return false;
    total += header.size;
    if (channel != nullptr && total > kvlink::kMaxBulkRequestBytes) return false;
  }
  uint32_t stored = 0;
  // Only a payload that matches the digest its sealed header gave enters the buffer.
  auto keep = [&](const Header& header, std::shared_ptr<KvPayload> payload) {
    if (!kvlink::constant_time_equal(kvlink::sha256(payload->bytes()), header.digest)) {
      ++rejected_blocks_;
      return;
    }
    store_.put(header.hash, BufferedKvStore::Payload(std::move(payload)));
    ++stored;
    ++received_blocks_;
    received_bytes_ += static_cast<int64_t>(header.size);
  };
  if (channel == nullptr) {  // 'P': the payloads follow the message, raw
    for (const Header& header : headers) {
      std::shared_ptr<KvPayload> payload = KvPayload::allocate(header.size);  // received in place: no copy
      if (!kvlink::read_exact(fd, payload->bytes())) return false;
      keep(header, std::move(payload));
    }
  } else {  // 'B': the payloads through the channel
    std::vector<std::shared_ptr<KvPayload>> payloads;
    std::vector<KvPayload*> targets;
    payloads.reserve(count);
    for (const Header& header : headers) {
      payloads.push_back(KvPayload::allocate(header.size));
      targets.push_back(payloads.back().get());
    }
    if (!channel->receive(targets)) return false;
    channel_bytes_ += static_cast<int64_t>(total);
    for (uint32_t i = 0; i < count; ++i) keep(headers[i], std::move(payloads[i]));
  }
  return session.send(fd, kvlink::MessageWriter().u32(stored).bytes);
}

void KvLinkServer::serve(int fd) {
  const int yes = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
  kvlink::set_timeouts(fd, std::min(kHandshakeTimeoutSeconds, options_.receive_timeout_seconds));
  std::unique_ptr<KvBulkChannel> channel;
  auto handle = [&]() {
    kvlink::HandshakeFailure failure = kvlink::HandshakeFailure::kNone;
    std::optional<kvlink::Session> session = kvlink::server_handshake(fd, options_.secret, failure);
    if (!session) {
      ++refused_connections_;
      spdlog::warn("KV link on {}:{}: refused a connection: {}", host_, port_, kvlink::handshake_failure_text(failure));
      return;
    }
    kvlink::set_timeouts(fd, options_.receive_timeout_seconds);
    std::vector<std::byte> body;
    while (!stopping_) {
      const kvlink::Session::Received received = session->receive(fd, body, kvlink::kMaxMessageBytes);
      if (received == kvlink::Session::Received::kForged) {
        ++forged_messages_;
        spdlog::warn("KV link on {}:{}: a message failed its authentication tag (changed, replayed or reordered "
                     "on the way): connection closed",
                     host_, port_);
        return;
      }
      if (received != kvlink::Session::Received::kOk) return;
      kvlink::MessageReader request(body);
      uint8_t op = 0;
      if (!request.u8(op)) return;
      const char code = static_cast<char>(op);
      if (code == kvlink::kOpHave) {
        uint32_t count = 0;
        if (!request.u32(count) || count > kvlink::kMaxBlocksPerRequest || request.remaining() != size_t{count} * 16)
          return;
        kvlink::MessageWriter answer;
        for (uint32_t i = 0; i < count; ++i) {
          KvBlockHash hash;
          request.hash(hash);
          const bool held = store_.in_buffer(hash) || (options_.cached && options_.cached(hash));
          answer.bytes.push_back(std::byte{held ? uint8_t{1} : uint8_t{0}});
        }
        if (!session->send(fd, answer.bytes)) return;
      } else if (code == kvlink::kOpPut) {
        if (!receive_put(fd, *session, request, nullptr)) return;
      } else if (code == kvlink::kOpBulkPut) {
        if (!channel || !receive_put(fd, *session, request, channel.get())) return;
      } else if (code == kvlink::kOpChannel) {
        if (request.remaining() > kvlink::kMaxPlaneNameBytes || channel) return;
        std::string name(request.remaining(), '\0');
        request.raw(std::as_writable_bytes(std::span(name)));
        KvDataPlane* plane = options_.plane;
        const bool joins = plane != nullptr && plane->name() == name;
        const std::byte answer{joins ? uint8_t{1} : uint8_t{0}};
        if (!session->send(fd, std::span(&answer, 1))) return;
        if (!joins) continue;
        std::string why;
        channel = plane->accept(fd, why);
        if (!channel) {
          spdlog::warn("KV link: a {} channel failed: {}", name, why);
          return;
        }
        ++channels_total_;
      } else {
        return;
      }
    }
  };
  handle();
  channel.reset();
  std::lock_guard lock(mutex_);
  connections_.erase(fd);
  ::close(fd);
}

}  // namespace loom
