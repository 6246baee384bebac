// The sending end of the KV link (kv_link_protocol.h): pushes named blocks
// from an engine's BufferedKvStore to another engine's KvLinkServer, skipping
// those the peer already holds in its buffer, so a multi-turn
// conversation moves only its new blocks. Outgoing blocks the peer now has
// leave the sender's buffer (BufferedKvStore::release_sent).
//
// Thread: any; one call is one connection, blocking until the peer has
// answered or failed.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include "kvstore/buffered_kv_store.h"

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

// Sends hashes' blocks to the KvLinkServer at `address` ("host:port").
// payload_bytes[i]: block i's size (read_storage reads it at that size).
// Throws Error(kUnavailable) naming the address when the link fails (connect,
// timeout, the peer closing); blocks the peer had already stored stay there.
KvSendReport send_kv_blocks(const std::string& address, std::span<const KvBlockHash> hashes,
                            std::span<const int64_t> payload_bytes, BufferedKvStore& source, const KvSendOptions& options);

}  // namespace loom
