#include "kvtransfer/kv_link_client.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <set>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "kvtransfer/kv_link_protocol.h"
#include "kvtransfer/kv_link_session.h"
#include "util/error.h"

namespace loom {

namespace {

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

// Sends one request and reads its sealed answer; false when the link failed (errno set, or 0 for a
// forged or closed answer).
bool exchange(int fd, kvlink::Session& session, std::span<const std::byte> request, std::vector<std::byte>& answer,
              uint32_t max_answer_bytes) {
  return session.send(fd, request) &&
         session.receive(fd, answer, max_answer_bytes) == kvlink::Session::Received::kOk;
}

// Which blocks the peer lacks (in batches under the protocol's cap) into wanted / wanted_bytes; false when the link failed.
bool ask_have(int fd, kvlink::Session& session, std::span<const KvBlockHash> hashes,
              std::span<const int64_t> payload_bytes, std::vector<KvBlockHash>& wanted,
              std::vector<int64_t>& wanted_bytes, KvSendReport& report) {
  errno = 0;
  for (size_t first = 0; first < hashes.size(); first += kvlink::kMaxBlocksPerRequest) {
    const size_t count = std::min<size_t>(kvlink::kMaxBlocksPerRequest, hashes.size() - first);
    kvlink::MessageWriter request;
    request.op(kvlink::kOpHave).u32(static_cast<uint32_t>(count));
    for (size_t i = 0; i < count; ++i) request.hash(hashes[first + i]);
    std::vector<std::byte> has;
    if (!exchange(fd, session, request.bytes, has, static_cast<uint32_t>(count)) || has.size() != count) return false;
    for (size_t i = 0; i < count; ++i) {
      if (has[i] != std::byte{0}) {
        ++report.skipped_blocks;
      } else {
        wanted.push_back(hashes[first + i]);
        wanted_bytes.push_back(payload_bytes[first + i]);
      }
    }
  }
  return true;
}

}  // namespace

struct KvLinkClient::Connection {
  int fd = -1;
  std::optional<kvlink::Session> session;  // set by the handshake
  std::unique_ptr<KvBulkChannel> channel;  // null: payloads inline
  std::chrono::steady_clock::time_point last_used;
  bool healthy = false;  // set once a send completed on it: only then is it pooled again
  bool reused = false;   // taken from the pool (the peer may have closed it meanwhile)
  ~Connection() {
    channel.reset();  // before the socket: a plane may still talk over it while closing
    if (fd >= 0) ::close(fd);
  }
};

KvLinkClient::KvLinkClient(KvDataPlane* plane, KvLinkClientOptions options) : plane_(plane), options_(options) {}

KvLinkClient::~KvLinkClient() = default;

KvLinkClientStats KvLinkClient::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

std::unique_ptr<KvLinkClient::Connection> KvLinkClient::open(const std::string& address, double timeout_seconds) {
  auto connection = std::make_unique<Connection>();
  connection->fd = connect_to(address, timeout_seconds);
  const int fd = connection->fd;
  std::string refused;
  connection->session = kvlink::client_handshake(fd, options_.secret, refused);
  if (!connection->session)
    throw Error(ErrorKind::kUnavailable, fmt::format("KV link to {}: handshake failed: {}", address, refused),
                "give both engines (and the router) the same --kv-transfer-secret-file");
  bool use_plane = plane_ != nullptr;
  if (use_plane) {
    std::lock_guard lock(mutex_);
    use_plane = planeless_peers_.count(address) == 0;
  }
  if (use_plane) {
    const std::string name = plane_->name();
    std::vector<std::byte> joins;
    errno = 0;
    if (!exchange(fd, *connection->session, kvlink::MessageWriter().op(kvlink::kOpChannel).raw(kvlink::as_bytes(name)).bytes,
                  joins, 1) ||
        joins.size() != 1)
      link_failed(address, "the channel request");
    if (joins[0] != std::byte{0}) {
      std::string failure;
      connection->channel = plane_->connect(fd, failure);
      if (!connection->channel) {
        // The control connection is in an unknown state: a new one, with payloads inline from now on
        // (two engines on one GPU, say, where NCCL makes no communicator).
        spdlog::warn("KV link to {}: its {} channel failed ({}); payloads go inline on TCP to it", address, name,
                     failure);
        connection.reset();
        {
          std::lock_guard lock(mutex_);
          planeless_peers_.insert(address);
        }
        return open(address, timeout_seconds);
      }
    }
  }
  std::lock_guard lock(mutex_);
  ++stats_.num_connections;
  if (connection->channel) ++stats_.num_channels;
  return connection;
}

std::unique_ptr<KvLinkClient::Connection> KvLinkClient::take(const std::string& address, double timeout_seconds,
                                                             bool fresh) {
  std::vector<std::unique_ptr<Connection>> stale;  // closed after the lock: a channel's teardown may wait on the GPU
  {
    std::unique_lock lock(mutex_);
    for (;;) {
      std::vector<std::unique_ptr<Connection>>& idle = idle_[address];
      const auto now = std::chrono::steady_clock::now();
      while (!idle.empty()) {
        std::unique_ptr<Connection> connection = std::move(idle.back());
        idle.pop_back();
        if (!fresh && std::chrono::duration<double>(now - connection->last_used).count() < options_.idle_seconds) {
          connection->healthy = false;
          connection->reused = true;
          return connection;
        }
        --num_open_[address];
        stale.push_back(std::move(connection));
      }
      if (num_open_[address] < options_.max_connections_per_peer) break;
      const bool freed = returned_.wait_for(lock, std::chrono::duration<double>(timeout_seconds), [&] {
        return !idle_[address].empty() || num_open_[address] < options_.max_connections_per_peer;
      });
      if (!freed)
        throw Error(ErrorKind::kUnavailable,
                    fmt::format("KV link to {}: no connection free within {} s", address, timeout_seconds));
    }
    ++num_open_[address];
  }
  try {
    return open(address, timeout_seconds);
  } catch (...) {
    std::lock_guard lock(mutex_);
    --num_open_[address];
    returned_.notify_all();
    throw;
  }
}

void KvLinkClient::give_back(const std::string& address, std::unique_ptr<Connection> connection) {
  {
    std::lock_guard lock(mutex_);
    if (connection->healthy) {
      connection->last_used = std::chrono::steady_clock::now();
      idle_[address].push_back(std::move(connection));
    } else {
      --num_open_[address];
    }
    returned_.notify_all();  // waiters for every peer share it
  }
  connection.reset();  // a broken one closes here, outside the lock
}

KvSendReport KvLinkClient::send(const std::string& address, std::span<const KvBlockHash> hashes,
                                std::span<const int64_t> payload_bytes, BufferedKvStore& source,
                                const KvSendOptions& options) {
  LOOM_CHECK(hashes.size() == payload_bytes.size());
  const auto start = std::chrono::steady_clock::now();
  KvSendReport report;
  kvlink::split_address(address);  // a malformed address is the caller's error, not the link's
  if (!options_.peers.allows(address))
    throw Error(ErrorKind::kInvalidArgument,
                fmt::format("KV link: {} is not an allowed peer ({})", address, options_.peers.describe()),
                "list the peer's KV link address in --kv-transfer-peers");
  if (hashes.empty()) return report;
  // A pooled connection the peer has closed since (it restarted, say) fails at the have query:
  // that query is retried once on a fresh connection.
  std::unique_ptr<Connection> held;
  std::vector<KvBlockHash> wanted;
  std::vector<int64_t> wanted_bytes;
  for (int attempt = 0;; ++attempt) {
    held = take(address, options.socket_timeout_seconds, /*fresh=*/attempt > 0);
    report.skipped_blocks = 0;
    wanted.clear();
    wanted_bytes.clear();
    if (ask_have(held->fd, *held->session, hashes, payload_bytes, wanted, wanted_bytes, report)) break;
    const bool retry = held->reused && attempt == 0;
    const int error = errno;
    give_back(address, std::move(held));  // not healthy: closed
    errno = error;
    if (!retry) link_failed(address, "the have query");
  }
  // Back to the pool (or closed, when the send did not complete) however the send ends.
  struct Return {
    KvLinkClient* client;
    const std::string& address;
    std::unique_ptr<Connection>& connection;
    ~Return() { client->give_back(address, std::move(connection)); }
  } give_back_on_exit{this, address, held};
  Connection& connection = *held;
  const int fd = connection.fd;
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
  int64_t channel_bytes = 0;
  for (size_t first = 0; first < present.size();) {
    // One request: under the block cap and, through a channel, the bulk size (at least one block).
    size_t count = 0;
    uint64_t request_bytes = 0;
    while (first + count < present.size() && count < kvlink::kMaxBlocksPerRequest) {
      const uint64_t size = payloads[present[first + count]]->size();
      if (connection.channel && count > 0 && request_bytes + size > options_.bulk_request_bytes) break;
      request_bytes += size;
      ++count;
    }
    // The sealed header message (each block's hash, size and SHA-256), then the payloads raw or through the channel.
    kvlink::MessageWriter request;
    request.op(connection.channel ? kvlink::kOpBulkPut : kvlink::kOpPut).u32(static_cast<uint32_t>(count));
    std::vector<const KvPayload*> bulk;
    for (size_t i = 0; i < count; ++i) {
      const size_t index = present[first + i];
      const KvPayload& payload = *payloads[index];
      request.hash(wanted[index]).u64(payload.size()).raw(kvlink::sha256(payload.bytes()));
      bulk.push_back(&payload);
    }
    errno = 0;
    bool ok = connection.session->send(fd, request.bytes);
    if (ok && connection.channel) {
      ok = connection.channel->send(bulk);
      if (ok) channel_bytes += static_cast<int64_t>(request_bytes);
    } else {
      for (size_t i = 0; ok && i < bulk.size(); ++i) ok = kvlink::write_all(fd, bulk[i]->bytes());
    }
    if (ok) report.sent_bytes += static_cast<int64_t>(request_bytes);
    std::vector<std::byte> answer;
    uint32_t stored = 0;
    if (!ok || connection.session->receive(fd, answer, 4) != kvlink::Session::Received::kOk ||
        !kvlink::MessageReader(answer).u32(stored))
      link_failed(address, "the block transfer");
    report.sent_blocks += stored;
    std::vector<KvBlockHash> delivered;
    for (size_t i = 0; i < count; ++i) delivered.push_back(wanted[present[first + i]]);
    source.release_sent(delivered);
    first += count;
  }
  const std::set<KvBlockHash> asked_for(wanted.begin(), wanted.end());
  std::vector<KvBlockHash> had;  // the peer had these: delivered too
  for (const KvBlockHash& hash : hashes)
    if (asked_for.count(hash) == 0) had.push_back(hash);
  source.release_sent(had);
  connection.healthy = true;
  {
    std::lock_guard lock(mutex_);
    stats_.num_channel_bytes += channel_bytes;
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

KvSendReport send_kv_blocks(const std::string& address, std::span<const KvBlockHash> hashes,
                            std::span<const int64_t> payload_bytes, BufferedKvStore& source, const KvSendOptions& options,
                            const std::string& secret) {
  KvLinkClient client(nullptr, {.max_connections_per_peer = 1, .idle_seconds = 0.0, .secret = secret});
  return client.send(address, hashes, payload_bytes, source, options);
}

}  // namespace loom
