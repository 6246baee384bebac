#include "kvtransfer/kv_link_protocol.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <string>

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

namespace {

template <typename T>
bool write_le(int fd, T value) {
  std::byte bytes[sizeof(T)];
  for (size_t i = 0; i < sizeof(T); ++i) bytes[i] = static_cast<std::byte>((value >> (8 * i)) & 0xff);
  return write_all(fd, bytes);
}

template <typename T>
bool read_le(int fd, T& value) {
  std::byte bytes[sizeof(T)];
  if (!read_exact(fd, bytes)) return false;
  value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= static_cast<T>(static_cast<T>(bytes[i]) << (8 * i));
  return true;
}

}  // namespace

bool write_u32(int fd, uint32_t value) { return write_le(fd, value); }
bool write_u64(int fd, uint64_t value) { return write_le(fd, value); }
bool read_u32(int fd, uint32_t& value) { return read_le(fd, value); }
bool read_u64(int fd, uint64_t& value) { return read_le(fd, value); }
bool write_hash(int fd, const KvBlockHash& hash) { return write_u64(fd, hash.high) && write_u64(fd, hash.low); }
bool read_hash(int fd, KvBlockHash& hash) { return read_u64(fd, hash.high) && read_u64(fd, hash.low); }

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

}  // namespace loom::kvlink
