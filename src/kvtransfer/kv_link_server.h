// The receiving end of the KV link (kv_link_protocol.h): a TCP listener that
// answers "have" queries from, and stores pushed blocks into, an engine's
// BufferedKvStore. A disaggregated engine (loom serve --role prefill|decode)
// runs one; its address is in /loom/kv/status.
//
// Each connection gets a thread (at most kMaxConnections at once; more are
// closed at accept), with a receive timeout so a stalled sender frees it.
// Each connection must first pass the handshake (kv_link_session.h): a peer
// that does not prove the shared secret is refused before it can send
// anything else, so nothing it sends enters the buffer. After it, nothing a
// peer sends can hurt the engine: a message whose tag fails or bad framing
// closes the connection, a payload that does not match its digest is
// dropped, and blocks only ever enter the buffer (never the engine's caches
// directly; the engine reads them from the buffer as from its disk tier).
//
// Without a secret (options.secret empty) the link authenticates nothing (its
// handshake runs with the empty key, which any peer holds), so it refuses to
// listen anywhere but on a loopback address.
//
// With a data plane (kv_data_plane.h), a client may set up a channel on its
// connection and push payloads through it ('C', 'B').
//
// Ownership: borrows the store and the plane, which must outlive the server.
// Thread: the constructor binds and starts the accept thread; the destructor
// (any thread) closes every connection and joins the threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kvstore/buffered_kv_store.h"
#include "kvtransfer/kv_data_plane.h"
#include "kvtransfer/kv_link_protocol.h"
#include "kvtransfer/kv_link_session.h"
#include "kvtransfer/worker_threads.h"

namespace loom {

struct KvLinkServerStats {
  int64_t num_received_blocks = 0, num_received_bytes = 0, num_connections = 0;
  int64_t num_rejected_blocks = 0;       // a payload that did not match its digest: dropped
  int64_t num_refused_connections = 0;   // failed the handshake (no or a wrong secret, protocol 1, not a link)
  int64_t num_forged_messages = 0;       // a message whose tag failed (changed, replayed, reordered): closed
  int64_t num_channel_bytes = 0;  // of num_received_bytes: through a data plane's channel
  int64_t num_channels = 0;       // channels set up since start
};

struct KvLinkServerOptions {
  double receive_timeout_seconds = 30.0;
  KvDataPlane* plane = nullptr;  // borrowed; null: payloads inline only
  // May be empty: whether the engine's own caches hold a block; a "have"
  // query counts those as held, so a sender skips them.
  std::function<bool(const KvBlockHash&)> cached{};
  // The secret shared with the peers (--kv-transfer-secret-file); "": none,
  // allowed only when the link listens on loopback.
  std::string secret{};
};

class KvLinkServer {
 public:
  static constexpr int kMaxConnections = 64;
  static constexpr double kHandshakeTimeoutSeconds = 5.0;  // a peer that connects and stays silent

  // Binds host:port (0: an ephemeral port). Throws Error(kInvalidArgument)
  // naming the address when it cannot, or when it is not a loopback address
  // and options.secret is empty.
  KvLinkServer(BufferedKvStore& store, const std::string& host, int port, KvLinkServerOptions options = {});
  ~KvLinkServer();
  KvLinkServer(const KvLinkServer&) = delete;
  KvLinkServer& operator=(const KvLinkServer&) = delete;

  int port() const { return port_; }
  const std::string& host() const { return host_; }
  bool authenticated() const { return !options_.secret.empty(); }
  KvLinkServerStats stats() const;

 private:
  void accept_loop();
  void serve(int fd);
  // One put request's blocks (count headers already framed by the op); false closes the connection.
  // `request`: the rest of the 'P' / 'B' message after its op.
  bool receive_put(int fd, kvlink::Session& session, kvlink::MessageReader& request, KvBulkChannel* channel);

  BufferedKvStore& store_;
  const KvLinkServerOptions options_;
  const std::string host_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  mutable std::mutex mutex_;  // guards the connections and threads
  std::set<int> connections_;
  kvlink::WorkerThreads threads_;  // one per connection
  std::thread accept_thread_;
  std::atomic<int64_t> received_blocks_{0}, received_bytes_{0}, rejected_blocks_{0}, connections_total_{0};
  std::atomic<int64_t> refused_connections_{0}, forged_messages_{0};
  std::atomic<int64_t> channel_bytes_{0}, channels_total_{0};
};

}  // namespace loom
