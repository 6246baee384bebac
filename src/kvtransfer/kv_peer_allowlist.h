// Which KV links an engine's /loom/kv/send may push to (--kv-transfer-peers):
// without a list, loopback addresses only (127.0.0.0/8, ::1, localhost: the
// engines of one machine); with one, exactly the listed HOST:PORT entries
// (HOST:* for any port of that host). Hosts are compared as written, never
// resolved, so a name must be listed as the router announces it.
//
// Immutable after construction; any thread.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace loom {

class KvPeerAllowlist {
 public:
  KvPeerAllowlist() = default;  // loopback only
  // "HOST:PORT,HOST:*,..." (spaces ignored; "" = loopback only). Throws
  // Error(kInvalidArgument) naming a malformed entry.
  static KvPeerAllowlist parse(const std::string& list);

  // Whether `address` ("host:port") may be sent to; false for a malformed one.
  bool allows(const std::string& address) const;
  // For errors: "loopback addresses only" or the list.
  std::string describe() const;

 private:
  std::vector<std::pair<std::string, int>> entries_;  // port 0: any
};

}  // namespace loom
