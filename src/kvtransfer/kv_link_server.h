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
// Ownership: borrows the store, which must outlive the server.
// Thread: the constructor binds and starts the accept thread; the destructor
// (any thread) closes every connection and joins the threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kvstore/buffered_kv_store.h"

namespace loom {

struct KvLinkServerStats {
  int64_t num_received_blocks = 0, num_received_bytes = 0, num_rejected_blocks = 0, num_connections = 0;
};

class KvLinkServer {
 public:
  static constexpr int kMaxConnections = 64;

  // Binds host:port (0: an ephemeral port). Throws Error(kInvalidArgument)
  // naming the address when it cannot.
  KvLinkServer(BufferedKvStore& store, const std::string& host, int port, double receive_timeout_seconds = 30.0);
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

  BufferedKvStore& store_;
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
};

}  // namespace loom
