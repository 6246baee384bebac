// A KV link's data plane: how block payloads cross between two engines once
// the link's TCP control connection (kv_link_protocol.h) has agreed on which
// blocks, their sizes and checksums. Without one, payloads travel inline on
// the TCP connection. With one (kvtransfer/nccl: NCCL between two GPUs), the
// control connection sets up a channel once ('C') and each put ('B') moves
// its payloads through it.
//
// Ownership: a plane is created once per engine and outlives the link's
// server and client; each channel belongs to one control connection and is
// destroyed with it.
// Thread: a plane's connect / accept may run on several threads at once; a
// channel is used by one thread at a time (its connection's).
#pragma once

#include <memory>
#include <span>
#include <string>

#include "kvstore/kv_payload.h"

namespace loom {

class KvBulkChannel {
 public:
  virtual ~KvBulkChannel() = default;
  // Moves payloads in order; both ends agreed on every size beforehand (the
  // receiver's payloads are allocated at those sizes). false: the channel is
  // broken (the peer died or timed out) and must not be used again.
  virtual bool send(std::span<const KvPayload* const> payloads) = 0;
  virtual bool receive(std::span<KvPayload* const> payloads) = 0;
};

class KvDataPlane {
 public:
  virtual ~KvDataPlane() = default;
  // What the client announces in 'C'; the server joins only a plane of the same name.
  virtual std::string name() const = 0;
  // Client side, on a connected control socket right after the client wrote
  // 'C' and the name and the server answered that it joins: exchanges the
  // plane's own handshake over `fd`. nullptr with `failure` set when it fails
  // (the control connection may then be unusable: the caller closes it).
  virtual std::unique_ptr<KvBulkChannel> connect(int fd, std::string& failure) = 0;
  // Server side, the same handshake's other end.
  virtual std::unique_ptr<KvBulkChannel> accept(int fd, std::string& failure) = 0;
};

}  // namespace loom
