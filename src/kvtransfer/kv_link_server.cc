#include "kvtransfer/kv_link_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "kvtransfer/kv_link_protocol.h"
#include "util/error.h"

namespace loom {

KvLinkServer::KvLinkServer(BufferedKvStore& store, const std::string& host, int port, double receive_timeout_seconds,
                           KvDataPlane* plane, std::function<bool(const KvBlockHash&)> cached)
    : store_(store), plane_(plane), cached_(std::move(cached)), host_(host),
      receive_timeout_seconds_(receive_timeout_seconds) {
  std::string failure;
  listen_fd_ = kvlink::open_socket(
      host, port, /*passive=*/true,
      [](int fd, const sockaddr* address, socklen_t length) {
        const int yes = 1;
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
        return ::bind(fd, address, length) == 0 && ::listen(fd, 64) == 0;
      },
      failure);
  if (listen_fd_ < 0)
    throw Error(ErrorKind::kInvalidArgument, fmt::format("KV link: cannot listen on {}:{}: {}", host, port, failure),
                "choose another --kv-transfer-port (0 picks a free one)");
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &length);
  port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  accept_thread_ = std::thread([this] { accept_loop(); });
}

KvLinkServer::~KvLinkServer() {
  stopping_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);
  accept_thread_.join();
  ::close(listen_fd_);
  std::vector<Connection> threads;
  {
    std::lock_guard lock(mutex_);
    for (int fd : connections_) ::shutdown(fd, SHUT_RDWR);
    threads.swap(threads_);
  }
  for (Connection& connection : threads) connection.thread.join();
}

KvLinkServerStats KvLinkServer::stats() const {
  return {received_blocks_.load(), received_bytes_.load(), rejected_blocks_.load(), connections_total_.load(),
          channel_bytes_.load(), channels_total_.load()};
}

void KvLinkServer::accept_loop() {
  while (!stopping_) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (stopping_) return;
      if (errno == EMFILE || errno == ENFILE) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      return;  // the listening socket is gone
    }
    std::lock_guard lock(mutex_);
    if (stopping_ || static_cast<int>(connections_.size()) >= kMaxConnections) {
      ::close(fd);
      continue;
    }
    reap_finished();
    connections_.insert(fd);
    ++connections_total_;
    auto done = std::make_shared<std::atomic<bool>>(false);
    threads_.push_back({std::thread([this, fd, done] {
                          serve(fd);
                          *done = true;
                        }),
                        done});
  }
}

void KvLinkServer::reap_finished() {
  for (auto it = threads_.begin(); it != threads_.end();) {
    if (*it->done) {
      it->thread.join();
      it = threads_.erase(it);
    } else {
      ++it;
    }
  }
}

bool KvLinkServer::receive_put(int fd, uint32_t count, KvBulkChannel* channel) {
  struct Header {
    KvBlockHash hash;
    uint64_t size = 0, checksum = 0;
  };
  auto read_header = [&](Header& header) {
    return kvlink::read_hash(fd, header.hash) && kvlink::read_u64(fd, header.size) &&
           kvlink::read_u64(fd, header.checksum) && header.size <= kvlink::kMaxPayloadBytes;
  };
  uint32_t stored = 0;
  auto keep = [&](const Header& header, std::shared_ptr<KvPayload> payload) {
    if (XXH3_64bits(payload->data(), payload->size()) != header.checksum) {
      ++rejected_blocks_;
      return;
    }
    store_.put(header.hash, BufferedKvStore::Payload(std::move(payload)));
    ++stored;
    ++received_blocks_;
    received_bytes_ += static_cast<int64_t>(header.size);
  };
  if (channel == nullptr) {  // 'P': each payload inline after its header
    for (uint32_t i = 0; i < count; ++i) {
      Header header;
      if (!read_header(header)) return false;
      std::shared_ptr<KvPayload> payload = KvPayload::allocate(header.size);  // received in place: no copy
      if (!kvlink::read_exact(fd, payload->bytes())) return false;
      keep(header, std::move(payload));
    }
    return kvlink::write_u32(fd, stored);
  }
  // 'B': every header, then the payloads through the channel.
  std::vector<Header> headers(count);
  uint64_t total = 0;
  for (Header& header : headers) {
    if (!read_header(header)) return false;
    total += header.size;
    if (total > kvlink::kMaxBulkRequestBytes) return false;
  }
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
  return kvlink::write_u32(fd, stored);
}

void KvLinkServer::serve(int fd) {
  const int yes = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
  kvlink::set_timeouts(fd, receive_timeout_seconds_);
  std::unique_ptr<KvBulkChannel> channel;
  auto handle = [&]() {
    std::byte magic[sizeof(kvlink::kMagic)];
    if (!kvlink::read_exact(fd, magic) || std::memcmp(magic, kvlink::kMagic, sizeof(magic)) != 0) return;
    while (!stopping_) {
      std::byte op{};
      uint32_t count = 0;
      if (!kvlink::read_exact(fd, std::span(&op, 1)) || !kvlink::read_u32(fd, count) ||
          count > kvlink::kMaxBlocksPerRequest)
        return;
      const char code = static_cast<char>(op);
      if (code == kvlink::kOpHave) {
        std::vector<std::byte> answer(count);
        for (uint32_t i = 0; i < count; ++i) {
          KvBlockHash hash;
          if (!kvlink::read_hash(fd, hash)) return;
          const bool held = store_.in_buffer(hash) || (cached_ && cached_(hash));
          answer[i] = std::byte{held ? uint8_t{1} : uint8_t{0}};
        }
        if (!kvlink::write_all(fd, answer)) return;
      } else if (code == kvlink::kOpPut) {
        if (!receive_put(fd, count, nullptr)) return;
      } else if (code == kvlink::kOpBulkPut) {
        if (!channel || !receive_put(fd, count, channel.get())) return;
      } else if (code == kvlink::kOpChannel) {
        if (count > kvlink::kMaxPlaneNameBytes || channel) return;
        std::string name(count, '\0');
        if (!kvlink::read_exact(fd, std::as_writable_bytes(std::span(name)))) return;
        const bool joins = plane_ != nullptr && plane_->name() == name;
        const std::byte answer{joins ? uint8_t{1} : uint8_t{0}};
        if (!kvlink::write_all(fd, std::span(&answer, 1))) return;
        if (!joins) continue;
        std::string failure;
        channel = plane_->accept(fd, failure);
        if (!channel) {
          spdlog::warn("KV link: a {} channel failed: {}", name, failure);
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
