#include "kvtransfer/kv_link_client.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <vector>

#include <fmt/format.h>
#include <xxhash.h>

#include "kvtransfer/kv_link_protocol.h"
#include "util/error.h"

namespace loom {

namespace {

class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

int connect_to(const std::string& address, double timeout_seconds) {
  const auto [host, port] = kvlink::split_address(address);
  std::string failure;
  const int connected = kvlink::open_socket(
      host, port, /*passive=*/false,
      [&](int fd, const sockaddr* candidate, socklen_t length) {
        kvlink::set_timeouts(fd, timeout_seconds);
        return ::connect(fd, candidate, length) == 0;
      },
      failure);
  if (connected < 0) throw Error(ErrorKind::kUnavailable, fmt::format("KV link to {}: {}", address, failure));
  const int yes = 1;
  ::setsockopt(connected, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
  return connected;
}

[[noreturn]] void link_failed(const std::string& address, const char* during) {
  throw Error(ErrorKind::kUnavailable, fmt::format("KV link to {} failed during {}: {}", address, during,
                                                   errno != 0 ? std::strerror(errno) : "the peer closed"));
}

}  // namespace

KvSendReport send_kv_blocks(const std::string& address, std::span<const KvBlockHash> hashes,
                            std::span<const int64_t> payload_bytes, BufferedKvStore& source, const KvSendOptions& options) {
  LOOM_CHECK(hashes.size() == payload_bytes.size());
  const auto start = std::chrono::steady_clock::now();
  KvSendReport report;
  if (hashes.empty()) return report;
  Socket socket(connect_to(address, options.socket_timeout_seconds));
  const int fd = socket.fd();
  errno = 0;
  if (!kvlink::write_all(fd, std::as_bytes(std::span(kvlink::kMagic)))) link_failed(address, "the handshake");
  // Which blocks the peer lacks, in batches under the protocol's cap.
  std::vector<KvBlockHash> wanted;
  std::vector<int64_t> wanted_bytes;
  for (size_t first = 0; first < hashes.size(); first += kvlink::kMaxBlocksPerRequest) {
    const size_t count = std::min<size_t>(kvlink::kMaxBlocksPerRequest, hashes.size() - first);
    const std::byte op{static_cast<uint8_t>(kvlink::kOpHave)};
    bool ok = kvlink::write_all(fd, std::span(&op, 1)) && kvlink::write_u32(fd, static_cast<uint32_t>(count));
    for (size_t i = 0; ok && i < count; ++i) ok = kvlink::write_hash(fd, hashes[first + i]);
    std::vector<std::byte> has(count);
    if (!ok || !kvlink::read_exact(fd, has)) link_failed(address, "the have query");
    for (size_t i = 0; i < count; ++i) {
      if (has[i] != std::byte{0}) {
        ++report.skipped_blocks;
      } else {
        wanted.push_back(hashes[first + i]);
        wanted_bytes.push_back(payload_bytes[first + i]);
      }
    }
  }
  if (options.read_storage) {
    const auto [num_read, num_bytes] = source.load_from_storage(wanted, wanted_bytes);
    report.read_blocks = num_read;
    report.read_bytes = num_bytes;
  }
  const std::vector<BufferedKvStore::Payload> payloads = source.wait_for(wanted, options.wait);
  std::vector<size_t> present;
  for (size_t i = 0; i < wanted.size(); ++i) {
    if (payloads[i]) {
      present.push_back(i);
    } else {
      ++report.missing_blocks;
    }
  }
  for (size_t first = 0; first < present.size(); first += kvlink::kMaxBlocksPerRequest) {
    const size_t count = std::min<size_t>(kvlink::kMaxBlocksPerRequest, present.size() - first);
    const std::byte op{static_cast<uint8_t>(kvlink::kOpPut)};
    bool ok = kvlink::write_all(fd, std::span(&op, 1)) && kvlink::write_u32(fd, static_cast<uint32_t>(count));
    for (size_t i = 0; ok && i < count; ++i) {
      const size_t index = present[first + i];
      const KvPayload& payload = *payloads[index];
      ok = kvlink::write_hash(fd, wanted[index]) && kvlink::write_u64(fd, payload.size()) &&
           kvlink::write_u64(fd, XXH3_64bits(payload.data(), payload.size())) && kvlink::write_all(fd, payload.bytes());
      if (ok) report.sent_bytes += static_cast<int64_t>(payload.size());
    }
    uint32_t stored = 0;
    if (!ok || !kvlink::read_u32(fd, stored)) link_failed(address, "the block transfer");
    report.sent_blocks += stored;
    std::vector<KvBlockHash> delivered;
    for (size_t i = 0; i < count; ++i) delivered.push_back(wanted[present[first + i]]);
    source.release_sent(delivered);
  }
  const std::set<KvBlockHash> asked_for(wanted.begin(), wanted.end());
  std::vector<KvBlockHash> had;  // the peer had these: delivered too
  for (const KvBlockHash& hash : hashes)
    if (asked_for.count(hash) == 0) had.push_back(hash);
  source.release_sent(had);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace loom
