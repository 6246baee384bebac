#include "kvtransfer/kv_link_protocol.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "util/error.h"

namespace loom::kvlink {

bool read_exact(int fd, std::span<std::byte> bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t count = ::recv(fd, bytes.data() + done, bytes.size() - done, 0);
    if (count < 0 && errno == EINTR) continue;
    if (count <= 0) return false;
    done += static_cast<size_t>(count);
  }
  return true;
}

bool write_all(int fd, std::span<const std::byte> bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t count = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (count < 0 && errno == EINTR) continue;
    if (count <= 0) return false;
    done += static_cast<size_t>(count);
  }
  return true;
}

MessageWriter& MessageWriter::op(char code) {
  bytes.push_back(static_cast<std::byte>(code));
  return *this;
}

MessageWriter& MessageWriter::u32(uint32_t value) {
  for (size_t i = 0; i < 4; ++i) bytes.push_back(static_cast<std::byte>((value >> (8 * i)) & 0xff));
  return *this;
}

MessageWriter& MessageWriter::u64(uint64_t value) {
  for (size_t i = 0; i < 8; ++i) bytes.push_back(static_cast<std::byte>((value >> (8 * i)) & 0xff));
  return *this;
}

MessageWriter& MessageWriter::hash(const KvBlockHash& value) { return u64(value.high).u64(value.low); }

MessageWriter& MessageWriter::raw(std::span<const std::byte> value) {
  bytes.insert(bytes.end(), value.begin(), value.end());
  return *this;
}

bool MessageReader::raw(std::span<std::byte> value) {
  if (remaining() < value.size()) return false;
  std::memcpy(value.data(), bytes_.data() + at_, value.size());
  at_ += value.size();
  return true;
}

bool MessageReader::u8(uint8_t& value) {
  std::byte byte{};
  if (!raw(std::span(&byte, 1))) return false;
  value = static_cast<uint8_t>(byte);
  return true;
}

bool MessageReader::u32(uint32_t& value) {
  std::byte bytes[4];
  if (!raw(bytes)) return false;
  value = 0;
  for (size_t i = 0; i < 4; ++i) value |= static_cast<uint32_t>(bytes[i]) << (8 * i);
  return true;
}

bool MessageReader::u64(uint64_t& value) {
  std::byte bytes[8];
  if (!raw(bytes)) return false;
  value = 0;
  for (size_t i = 0; i < 8; ++i) value |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  return true;
}

bool MessageReader::hash(KvBlockHash& value) {
  if (remaining() < 16) return false;
  return u64(value.high) && u64(value.low);
}

void set_timeouts(int fd, double seconds) {
  timeval timeout{};
  timeout.tv_sec = static_cast<time_t>(seconds);
  timeout.tv_usec = static_cast<suseconds_t>((seconds - std::floor(seconds)) * 1e6);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
}

int open_socket(const std::string& host, int port, bool passive,
                const std::function<bool(int fd, const sockaddr* address, socklen_t length)>& use, std::string& failure) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int error = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found); error != 0) {
    failure = gai_strerror(error);
    return -1;
  }
  int opened = -1;
  failure = "no address";
  for (addrinfo* candidate = found; candidate != nullptr && opened < 0; candidate = candidate->ai_next) {
    const int fd = ::socket(candidate->ai_family, candidate->ai_socktype | SOCK_CLOEXEC, candidate->ai_protocol);
    if (fd < 0) continue;
    if (use(fd, candidate->ai_addr, candidate->ai_addrlen)) {
      opened = fd;
    } else {
      failure = std::strerror(errno);
      ::close(fd);
    }
  }
  ::freeaddrinfo(found);
  return opened;
}

std::pair<std::string, int> split_address(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon != std::string::npos && colon > 0) {
    try {
      size_t used = 0;
      port = std::stoi(address.substr(colon + 1), &used);
      if (used != address.size() - colon - 1) port = 0;
    } catch (const std::exception&) {
      port = 0;
    }
  }
  if (port <= 0 || port > 65535)
    throw Error(ErrorKind::kInvalidArgument, fmt::format("'{}' is not a KV link address", address),
                "write HOST:PORT, as an engine's /loom/kv/status reports it");
  return {address.substr(0, colon), port};
}

bool is_loopback(const sockaddr* address) {
  if (address->sa_family == AF_INET) {
    const auto* ipv4 = reinterpret_cast<const sockaddr_in*>(address);
    return (ntohl(ipv4->sin_addr.s_addr) >> 24) == 127;
  }
  if (address->sa_family == AF_INET6) {
    const in6_addr& ipv6 = reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(&ipv6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&ipv6) && ipv6.s6_addr[12] == 127;
  }
  return false;
}

Listener listen_for_kv(const std::string& host, int port, bool has_secret, const std::string& what,
                       const std::string& port_hint) {
  std::string failure;
  Listener listener;
  listener.fd = open_socket(
      host, port, /*passive=*/true,
      [](int fd, const sockaddr* address, socklen_t length) {
        const int yes = 1;
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
        return ::bind(fd, address, length) == 0 && ::listen(fd, 64) == 0;
      },
      failure);
  if (listener.fd < 0)
    throw Error(ErrorKind::kInvalidArgument, fmt::format("{}: cannot listen on {}:{}: {}", what, host, port, failure),
                port_hint);
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  ::getsockname(listener.fd, reinterpret_cast<sockaddr*>(&bound), &length);
  listener.port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                              : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  if (!has_secret && !is_loopback(reinterpret_cast<const sockaddr*>(&bound))) {
    ::close(listener.fd);
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("{}: refusing to listen on {} without a shared secret: any host that reaches it could "
                            "write KV blocks other requests then read",
                            what, host),
                "give every engine and the router the same --kv-transfer-secret-file, or keep the link on "
                "loopback (--kv-transfer-host 127.0.0.1, the default)");
  }
  return listener;
}

int accept_connection(int listen_fd, const std::atomic<bool>& stopping) {
  while (!stopping) {
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) return fd;
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (stopping) return -1;
    if (errno == EMFILE || errno == ENFILE) {  // out of descriptors: wait for some to close
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    return -1;  // the listening socket is gone
  }
  return -1;
}

}  // namespace loom::kvlink
