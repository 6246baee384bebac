// The sending end of the KV link (kv_link_protocol.h): pushes named blocks
// from an engine's BufferedKvStore to another engine's KvLinkServer, skipping
// those the peer already holds in its buffer, so a multi-turn
// conversation moves only its new blocks. Outgoing blocks the peer now has
// leave the sender's buffer (BufferedKvStore::release_sent).
//
// A KvLinkClient keeps its connections to each peer open between sends (at
// most max_connections_per_peer at once; more sends wait for one), so a data
// plane's channel (kv_data_plane.h: NCCL's communicator, costly to set up) is
// made once per connection. With a plane, each new connection asks the peer
// for a channel; a peer without the plane answers no and the connection
// carries payloads inline, and so does every later connection to a peer whose
// channel failed to set up (two engines on one GPU: NCCL makes no
// communicator there). A pooled connection that fails its first exchange is
// replaced once by a fresh one (the peer restarted).
//
// Every connection starts with the handshake (kv_link_session.h) under
// options.secret: a peer that does not prove the same secret is never sent a
// block, and every request and answer is sealed. A send goes only to an
// address options.peers allows (loopback only by default).
//
// Thread: any; a send holds one connection, blocking until the peer has
// answered or failed.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "kvstore/buffered_kv_store.h"
#include "kvtransfer/kv_data_plane.h"
#include "kvtransfer/kv_peer_allowlist.h"

namespace loom {

struct KvSendOptions {
  // Read blocks missing from the buffer out of the store's storage tier first
  // (DualPath's storage -> DE -> PE path: the sender's storage bandwidth).
  bool read_storage = false;
  // How long to wait for blocks not yet buffered (the sender's own prefill is
  // still writing them through).
  std::chrono::milliseconds wait{0};
  double socket_timeout_seconds = 30.0;
};

struct KvSendReport {
  int64_t sent_blocks = 0, sent_bytes = 0;
  int64_t skipped_blocks = 0;  // the peer had them
  int64_t missing_blocks = 0;  // neither buffered nor readable here: the peer recomputes them
  int64_t read_blocks = 0, read_bytes = 0;  // read from storage for this send
  double seconds = 0;
};

struct KvLinkClientOptions {
  int max_connections_per_peer = 4;
  // An idle connection older than this is closed rather than reused (the
  // server drops a connection silent for its receive timeout, 30 s).
  double idle_seconds = 10.0;
  uint64_t bulk_request_bytes = 256ull << 20;  // payloads per 'B' request
  std::string secret{};    // shared with the peers ("" = none: only peers without one accept)
  KvPeerAllowlist peers{}; // where sends may go (default: loopback addresses)
};

struct KvLinkClientStats {
  int64_t num_connections = 0, num_channels = 0;  // opened since start
  int64_t num_channel_bytes = 0;                  // payload bytes sent through a channel
};

class KvLinkClient {
 public:
  // `plane` (borrowed, may be null) must outlive the client.
  explicit KvLinkClient(KvDataPlane* plane = nullptr, KvLinkClientOptions options = {});
  ~KvLinkClient();
  KvLinkClient(const KvLinkClient&) = delete;
  KvLinkClient& operator=(const KvLinkClient&) = delete;

  // Sends hashes' blocks to the KvLinkServer at `address` ("host:port").
  // payload_bytes[i]: block i's size (read_storage reads it at that size).
  // Throws Error(kInvalidArgument) for a malformed address or one the
  // allowlist refuses, Error(kUnavailable) naming the address when the link
  // fails (connect, timeout, the peer closing, a failed handshake: no or
  // another secret, an older Loom); blocks the peer had already stored stay there.
  KvSendReport send(const std::string& address, std::span<const KvBlockHash> hashes,
                    std::span<const int64_t> payload_bytes, BufferedKvStore& source, const KvSendOptions& options);
  KvLinkClientStats stats() const;
  bool allows_peer(const std::string& address) const { return options_.peers.allows(address); }
  const KvPeerAllowlist& peers() const { return options_.peers; }

 private:
  struct Connection;
  // An idle connection to `address` (none when `fresh`: idle ones are closed), else a new one.
  std::unique_ptr<Connection> take(const std::string& address, double timeout_seconds, bool fresh = false);
  void give_back(const std::string& address, std::unique_ptr<Connection> connection);
  std::unique_ptr<Connection> open(const std::string& address, double timeout_seconds);

  KvDataPlane* const plane_;
  const KvLinkClientOptions options_;
  mutable std::mutex mutex_;  // guards the pools and counts
  std::condition_variable returned_;
  std::map<std::string, std::vector<std::unique_ptr<Connection>>> idle_;
  std::map<std::string, int> num_open_;  // per peer, idle or in use
  std::set<std::string> planeless_peers_;  // peers whose channel failed once: payloads inline to them
  KvLinkClientStats stats_;
};

// One send on a connection of its own (no pooling, no plane), under `secret`.
KvSendReport send_kv_blocks(const std::string& address, std::span<const KvBlockHash> hashes,
                            std::span<const int64_t> payload_bytes, BufferedKvStore& source, const KvSendOptions& options,
                            const std::string& secret = "");

}  // namespace loom
