// The receiving end of the KV link (kv_link_protocol.h): a TCP listener that
// answers "have" queries from, and stores pushed blocks into, an engine's
// BufferedKvStore. A disaggregated engine (loom serve --role prefill|decode)
// runs one; its address is in /loom/kv/status.
//
// Each connection gets a thread (at most kMaxConnections at once; more are
// closed at accept), with a receive timeout so a stalled sender frees it.
// Nothing a peer sends can hurt the engine: bad framing closes the
// connection, a bad checksum drops the block, and blocks only ever enter the
// buffer (never the engine's caches directly; the engine reads them from the
// buffer as from its disk tier).
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

namespace loom {

struct KvLinkServerStats {
  int64_t num_received_blocks = 0, num_received_bytes = 0, num_rejected_blocks = 0, num_connections = 0;
  int64_t num_channel_bytes = 0;  // of num_received_bytes: through a data plane's channel
  int64_t num_channels = 0;       // channels set up since start
};

class KvLinkServer {
 public:
  static constexpr int kMaxConnections = 64;

  // Binds host:port (0: an ephemeral port). Throws Error(kInvalidArgument)
  // naming the address when it cannot.
  // `cached` (may be empty): whether the engine's own caches hold a block; a
  // "have" query counts those as held, so a sender skips them.
  KvLinkServer(BufferedKvStore& store, const std::string& host, int port, double receive_timeout_seconds = 30.0,
               KvDataPlane* plane = nullptr, std::function<bool(const KvBlockHash&)> cached = {});
  ~KvLinkServer();
  KvLinkServer(const KvLinkServer&) = delete;
  KvLinkServer& operator=(const KvLinkServer&) = delete;

  int port() const { return port_; }
  const std::string& host() const { return host_; }
  KvLinkServerStats stats() const;

 private:
  void accept_loop();
  void serve(int fd);
  void reap_finished();  // requires mutex_
  // One put request's blocks (count headers already framed by the op); false closes the connection.
  bool receive_put(int fd, uint32_t count, KvBulkChannel* channel);

  BufferedKvStore& store_;
  KvDataPlane* const plane_;
  const std::function<bool(const KvBlockHash&)> cached_;
  const std::string host_;
  const double receive_timeout_seconds_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  mutable std::mutex mutex_;  // guards the connections and threads
  std::set<int> connections_;
  struct Connection {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Connection> threads_;
  std::thread accept_thread_;
  std::atomic<int64_t> received_blocks_{0}, received_bytes_{0}, rejected_blocks_{0}, connections_total_{0};
  std::atomic<int64_t> channel_bytes_{0}, channels_total_{0};
};

}  // namespace loom
